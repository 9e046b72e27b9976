"""Tables of the ledger. The primary key of device_allocations is what makes double allocation
impossible: two allocators racing for one device cannot both commit."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    event,
    false,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

BigId = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Cohort(Base):
    __tablename__ = "cohorts"
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    # None: a top cohort. A foreign key on PostgreSQL; on SQLite a plain column (migration 0016), the
    # broker checks it names a cohort and makes no cycle (shared/admission/quota.py's parse).
    parent: Mapped[str | None] = mapped_column(ForeignKey("cohorts.name"), nullable=True)


class CohortQuotaRow(Base):
    """A cohort's own quota of a flavor, shared by its subtree (contract, Quotas: nested cohorts)."""

    __tablename__ = "cohort_quotas"
    cohort: Mapped[str] = mapped_column(ForeignKey("cohorts.name", ondelete="CASCADE"), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(253), primary_key=True)
    nominal: Mapped[int] = mapped_column(Integer, default=0)
    borrowing_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lending_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)


class QuotaSettings(Base):
    """One row (id 1) of settings of the whole quota configuration: fairSharing.halfLife in seconds (0:
    shares count only what runs now). Configuration: its writes move config_revision."""

    __tablename__ = "quota_settings"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    half_life_s: Mapped[float] = mapped_column(Float, server_default="0")


class PastUse(Base):
    """A tenant's past use of a flavor in GPU units (shared/admission/past_use.py) as of `as_of` (unix
    seconds): written by the allocator in its decision transaction, so a restart goes on from it."""

    __tablename__ = "past_use"
    tenant: Mapped[str] = mapped_column(String(253), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(253), primary_key=True)
    units: Mapped[float] = mapped_column(Float)
    as_of: Mapped[float] = mapped_column(Float)


class Tenant(Base):
    __tablename__ = "tenants"
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    cohort: Mapped[str | None] = mapped_column(ForeignKey("cohorts.name"), nullable=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    pending_alert_after_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    admin_access: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    max_pending: Mapped[int | None] = mapped_column(Integer, nullable=True)
    min_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_preemptions_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gang_reserve_after_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: the broker's; 0: off


class Flavor(Base):
    __tablename__ = "flavors"
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    selector: Mapped[str] = mapped_column(Text)
    value: Mapped[float] = mapped_column(Float, default=1.0)
    position: Mapped[int] = mapped_column(Integer, default=0)


class Quota(Base):
    __tablename__ = "quotas"
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(253), primary_key=True)
    nominal: Mapped[int] = mapped_column(Integer, default=0)
    borrowing_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lending_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Claim(Base):
    __tablename__ = "claims"
    __table_args__ = (UniqueConstraint("namespace", "name"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    namespace: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    sequence: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Arrival order for fair share; a preempted claim keeps its place. None: the row's id (the allocator
    # inserts new claims in bulk, in the order they were queued).
    arrival: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    allocated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, index=True)
    # The flavor of its last allocation's first device, kept after release: the usage page's waits before
    # admission per tenant and flavor (with allocated_at - submitted_at).
    flavor: Mapped[str | None] = mapped_column(String(253), nullable=True)
    # Why it waits, as structured data (blocking quotas, shortfall, what preemption would take, what
    # change would let it in), written by the allocator with each Pending decision; served by the API.
    explain: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The allocator revision (allocator_leases.revision, taken under the shard's lock) of the transaction
    # that last wrote the row, set on every flush (`_stamp_revision`); OUTSIDE when written outside a
    # decision transaction. The allocator reads only rows written since its last read (one index range).
    revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True, index=True)
    # The claims stream's sequences of the last submission and the last release of this name seen: a
    # submission published before the last release is released already, and a release published before
    # the last submission of a queued claim is of an earlier one (both reach us out of order when a
    # message is redelivered after a crash), so neither is lost nor applied to the wrong claim.
    submitted_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    released_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The start estimate last published for it while it waited (the contract's estimatedStart object), which
    # its later Pending statuses carry; and the last and first p50 published (unix seconds), kept after its
    # allocation: the estimates' error against allocated_at (shared/ledger/estimates.py).
    estimated_start: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    estimate_p50: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_estimate_p50: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Why the estimate last published is null (its estimatedStartReason), carried as estimated_start is; None
    # when it had a value or none was published. Set: a null was published (a restarted estimator knows it).
    estimate_reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class DeviceAllocation(Base):
    __tablename__ = "device_allocations"
    driver: Mapped[str] = mapped_column(String(63), primary_key=True)
    pool: Mapped[str] = mapped_column(String(253), primary_key=True)
    device: Mapped[str] = mapped_column(String(253), primary_key=True)
    claim_id: Mapped[int] = mapped_column(ForeignKey("claims.id", ondelete="CASCADE"), index=True)
    node: Mapped[str] = mapped_column(String(253))
    request: Mapped[str] = mapped_column(String(253))
    allocated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The quota flavor the device counts against (None: no flavor accepts it) and its GPU units, so
    # usage per tenant and flavor is one GROUP BY, without the fleet.
    flavor: Mapped[str | None] = mapped_column(String(253), nullable=True, index=True)
    units: Mapped[float] = mapped_column(Float, default=0.0)


class InboxMessage(Base):
    """Ids of messages whose effects are committed; a redelivery finds its id here and changes nothing.
    An id counts per kind of message and tenant (shared/ledger/inbox.py); rows go after a retention."""

    __tablename__ = "inbox"
    # Pruning reads a consumer's oldest ids: by the primary key's consumer prefix, it would scan them all.
    __table_args__ = (Index("ix_inbox_consumer_processed_at", "consumer", "processed_at"),)
    consumer: Mapped[str] = mapped_column(String(64), primary_key=True)
    message_id: Mapped[str] = mapped_column(String(255), primary_key=True)  # before kind: looked up by id
    kind: Mapped[str] = mapped_column(String(16), primary_key=True, server_default="")  # '': written before 0011
    tenant: Mapped[str] = mapped_column(String(253), primary_key=True, server_default="")
    processed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class EarlyRelease(Base):
    """A release of a claim the ledger has no row of, remembered for a while (not a claim row: a release
    of a name never submitted leaves nothing for good): its submission, published before it but delivered
    after it (redelivered after a crash), then ends Released. Pruned after the inbox's retention, and at
    most a bounded number per tenant (shared/ledger/intake.write)."""

    __tablename__ = "early_releases"
    tenant: Mapped[str] = mapped_column(String(253), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    released_seq: Mapped[int] = mapped_column(BigInteger)  # the claims stream's sequence of the release
    released_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class GangWait(Base):
    """A waiting gang's clocks, as the allocator's admission state last had them (unix seconds; None: not
    running): since when it has been first in its tenant's order (its gangReserveAfter counts from it) and
    since when it has been complete (its gang-topology-wait). Written as they change, in the decision
    transaction, so a restarted allocator counts on (shared/ledger/gang_waits.py); a row goes when its
    gang is admitted or has no member waiting."""

    __tablename__ = "gang_waits"
    tenant: Mapped[str] = mapped_column(String(253), primary_key=True)
    gang: Mapped[str] = mapped_column(String(253), primary_key=True)
    complete_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_since: Mapped[float | None] = mapped_column(Float, nullable=True)


class OutboxEvent(Base):
    """Events committed with the decision that caused them; published after commit, with Nats-Msg-Id."""

    __tablename__ = "outbox"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    subject: Mapped[str] = mapped_column(String(512))
    message_id: Mapped[str] = mapped_column(String(255), unique=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, index=True)
    # Seconds JetStream keeps the message (its Nats-TTL header); None: as long as the stream keeps any. The
    # answer to a release of an unknown claim expires, so bogus names leave no subject behind for good.
    ttl_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    tenant: Mapped[str | None] = mapped_column(String(253), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class BusCredential(Base):
    """A credential for the NATS bus (shared/contract/bus_auth.py): only a bcrypt hash of its password is kept, the
    form nats-server itself checks, so the rendered server config holds no secret either."""

    __tablename__ = "bus_credentials"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(300), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # tenant | alerts
    tenant: Mapped[str | None] = mapped_column(String(253), nullable=True)
    password_hash: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class AuditEntry(Base):
    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    actor: Mapped[str] = mapped_column(String(253))
    action: Mapped[str] = mapped_column(String(32))
    entity: Mapped[str] = mapped_column(String(512))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class AlertRecord(Base):
    """Alert history: one row per episode (key + first_seen), updated by every message published for it."""

    __tablename__ = "alerts"
    __table_args__ = (UniqueConstraint("key", "first_seen"),)
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(64), index=True)
    severity: Mapped[str] = mapped_column(String(16))
    tenant: Mapped[str | None] = mapped_column(String(253), nullable=True, index=True)
    summary: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(JSON)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    count: Mapped[int] = mapped_column(Integer, default=1)
    resolved: Mapped[bool] = mapped_column(Boolean, default=False, index=True)
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class WebhookDeadLetter(Base):
    """A webhook delivery that failed every attempt: kept so an operator can see and replay it."""

    __tablename__ = "webhook_dead_letters"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    url: Mapped[str] = mapped_column(Text)
    alert_key: Mapped[str] = mapped_column(String(512), index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer)
    last_error: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class DeadLetter(Base):
    """A message whose effects could not be committed even on its own: kept with its error for an operator
    (and acknowledged), so it never holds up or takes down the messages behind it."""

    __tablename__ = "dead_letters"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    consumer: Mapped[str] = mapped_column(String(64))
    message_id: Mapped[str] = mapped_column(String(255), index=True)
    subject: Mapped[str] = mapped_column(Text)
    payload: Mapped[bytes] = mapped_column(LargeBinary)  # as received, cut at DEAD_LETTER_PAYLOAD_LIMIT
    payload_size: Mapped[int] = mapped_column(BigInteger)
    error: Mapped[str] = mapped_column(Text)
    deliveries: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


DEAD_LETTER_PAYLOAD_LIMIT = 1 << 20


class ClaimEvent(Base):
    """A claim's history: every status it was given, with who preempted it when it was."""

    __tablename__ = "claim_events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    claim_id: Mapped[int] = mapped_column(ForeignKey("claims.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    sequence: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    node: Mapped[str | None] = mapped_column(String(253), nullable=True)
    by: Mapped[str | None] = mapped_column(String(512), nullable=True)  # the preemptor, "tenant/claim"


class ConfigRevision(Base):
    """One row whose revision the database moves whenever tenants, quotas, cohorts, flavors, cohort_quotas or
    quota_settings change (triggers, migrations 0015 and 0016): the allocator reads the quota configuration
    again only when it moved."""

    __tablename__ = "config_revision"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    revision: Mapped[int] = mapped_column(BigInteger, server_default="0")


class AllocatorLease(Base):
    """One active decider per shard: the holder renews `expires_at`; every decision transaction locks
    this row and bumps `revision`, so a second allocator waits, then sees what the first wrote."""

    __tablename__ = "allocator_leases"
    shard: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(253), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revision: Mapped[int] = mapped_column(BigInteger, default=0)


REVISION = "claimbroker.revision"  # Session.info key: the allocator revision this transaction writes
OUTSIDE = 1 << 62  # the revision of a claim row written outside a decision transaction: above every other


@event.listens_for(Session, "before_flush")
def _stamp_revision(session: Session, _context: Any, _instances: Any) -> None:
    """Every claim row a flush inserts or changes carries the revision of the transaction that wrote it
    (what `UnitOfWork.take_turn` put in the session's info; OUTSIDE for a writer outside a decision
    transaction: the allocator's next read takes such rows and stamps them with its own revision)."""
    revision = session.info.get(REVISION, OUTSIDE)
    for row in session.new:
        if isinstance(row, Claim):
            row.revision = revision
    for row in session.dirty:
        if isinstance(row, Claim) and session.is_modified(row):
            row.revision = revision


class UsageSample(Base):
    """Devices in use per tenant and flavor, and each flavor's devices in the fleet (tenant ''), once a
    minute: the usage page's fleet over time. Kept a week and a day (shared/ledger/usage_history.py)."""

    __tablename__ = "usage_samples"
    at: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # unix seconds, a whole minute
    tenant: Mapped[str] = mapped_column(String(253), primary_key=True)
    flavor: Mapped[str] = mapped_column(String(253), primary_key=True)
    used: Mapped[int] = mapped_column(Integer, default=0)
    nominal: Mapped[int] = mapped_column(Integer, default=0)
    capacity: Mapped[int] = mapped_column(Integer, default=0)  # the fleet row's; 0 on a tenant's
