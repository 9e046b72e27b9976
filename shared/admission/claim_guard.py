"""Poison isolation for the decision core: whatever goes wrong while deciding one claim is that claim's
outcome, never the cycle's.

The core's methods that work on one waiting claim are marked with `per_claim`: an exception escaping
one of them is re-raised as a `ClaimFault` naming the claim. The cycle's single guard
(`shared.admission.cycle.run_cycle`) catches it, sets the claim aside with `fault_decision`, forgets the
state it had kept (it may be half updated) and decides the cycle again without that claim, so every
other claim is decided as if the faulty one were not there.

A fault of the claim's own making (a selector that fails on a device, an expression nested too deeply)
makes it Rejected, as the contract says; anything else is a fault of ours: the claim stays Pending with
an `internal error` reason and the shell raises an `internal-error` alert naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from shared.dra import model as dra
from shared.dra.cel import SelectorError
from shared.dra.results import Decision, Rejected, State

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

# Faults that say the claim is wrong as written: a selector that fails at run time, a spec deeper than
# the interpreter can follow. They make the claim Rejected.
CLAIM_ERRORS: tuple[type[BaseException], ...] = (Rejected, SelectorError, dra.DocumentError, RecursionError)
MAX_FAULTS_PER_CYCLE = 64  # more in one cycle is no longer one bad claim: the cycle itself is at fault


class _Keyed(Protocol):
    @property
    def key(self) -> tuple[str, str]: ...


class ClaimFault(Exception):
    """An exception raised while the core worked on one claim, with that claim's key."""

    def __init__(self, key: tuple[str, str], error: BaseException) -> None:
        super().__init__(f"{key[0]}/{key[1]}: {type(error).__name__}: {error}")
        self.key = key
        self.error = error


def per_claim(method: Callable[Concatenate[S, Any, P], R]) -> Callable[Concatenate[S, Any, P], R]:
    """Marks a method whose first argument is the waiting claim it works on: its failures name it."""

    @functools.wraps(method)
    def guarded(self: S, claim: _Keyed, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, claim, *args, **kwargs)
        except ClaimFault:
            raise
        except Exception as error:  # the one guarded place per claim: any failure is the claim's outcome
            raise ClaimFault(claim.key, error) from error

    return guarded


def describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def fault_decision(fault: ClaimFault) -> tuple[Decision, str | None]:
    """The faulty claim's decision, and the internal error to alert on (None when the claim is wrong)."""
    error = fault.error
    if isinstance(error, RecursionError):
        return Decision(State.REJECTED, reason="claim is nested too deeply to be evaluated"), None
    if isinstance(error, CLAIM_ERRORS):
        return Decision(State.REJECTED, reason=describe(error)), None
    internal = f"{type(error).__name__}: {describe(error)}"
    return Decision(State.PENDING, reason=f"internal error while deciding this claim ({internal}); it is set "
                                          "aside and tried again later, and operators were alerted"), internal


__all__ = ["CLAIM_ERRORS", "MAX_FAULTS_PER_CYCLE", "ClaimFault", "fault_decision", "per_claim"]
