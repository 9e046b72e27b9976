"""Which of the database's errors pass: the one place that reads their kinds (SQLAlchemy's exception
classes, PostgreSQL's SQLSTATE codes). A consumer's delivery shell (services/bus/consumer.py) decides from
these what becomes of the messages whose transaction failed."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

# What a transaction on the ledger raises when it fails: SQLAlchemy's errors (the driver's, wrapped; a pool
# timeout; a session left unusable), and the OSError of a connection refused or dropped before SQLAlchemy
# wraps it (TimeoutError is one).
LEDGER_ERRORS = (SQLAlchemyError, OSError)

# serialization failure, deadlock, lock not available, admin/crash shutdown, cannot connect now, connection
# failure, connection does not exist
_PASSING_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57P01", "57P02", "57P03", "08006", "08003"})


def unavailable(error: BaseException) -> bool:
    """The ledger is away or could not serialise the transaction (a lost connection, PostgreSQL restarted or
    a backend terminated, a serialization failure, a deadlock, a lock timeout): the same transaction
    succeeds once it is back, and nothing is wrong with what it was asked to write."""
    if getattr(error, "connection_invalidated", False):  # SQLAlchemy's mark of a disconnect
        return True
    driver_error = getattr(error, "orig", None)
    code = getattr(driver_error, "sqlstate", None) or getattr(driver_error, "pgcode", None)
    return code in _PASSING_SQLSTATES or isinstance(error, ConnectionError | TimeoutError)


def refused(error: BaseException) -> bool:
    """The ledger refused the transaction's writes (a constraint, as when another allocator was first to a
    device; SQLite's lock held too long): it may well pass when the transaction is tried again."""
    return isinstance(error, IntegrityError | OperationalError) and not unavailable(error)
