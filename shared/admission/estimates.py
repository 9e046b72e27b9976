"""Start estimates (issue 39): when the broker expects each waiting claim to be allocated, as p50 and p90, from
the same decision core run forward on a clock of its own. Pure: time is the snapshot's `now`.

Two forward runs from the snapshot (shared/admission/forward_run.py): in one every running claim ends at its
allocation time plus its p50 runtime given how long it has run (never before now) and every claim admitted
meanwhile runs its p50; in the other the same with p90. Runtimes (shared/admission/runtimes.py): a claim's
claimbroker.io/expected-runtime, else its tenant's observed runtimes on the flavor it holds, else its
tenant's, else a default; a running claim with none of them never ends within the run. A claim's p50 and p90
are the instants it is admitted in each run (the earlier of the two is its p50). Beyond the first `exact`
admissions of a run (EXACT_ADMISSIONS) the claims left are extrapolated (shared/admission/extrapolation.py).
A gang whose members have not all arrived waits for them: its members get no estimate, and say so; a complete
gang starts when its last member does. A claim no run starts gets none, with the reason (`Estimate.reason`).
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from typing import Any

from shared.admission.estimate_text import rfc3339, rough_duration
from shared.admission.extrapolation import REJECTED, UNSATISFIABLE, Fits, Trials, extrapolate, size_of, turns
from shared.admission.flavors import FleetFlavors
from shared.admission.forward_run import ForwardRun, Start
from shared.admission.kept import KeptState
from shared.admission.model import ClaimKey, Snapshot, Waiting
from shared.admission.runtimes import Quantiles, Runtimes
from shared.admission.waiting_queue import WaitingQueue
from shared.contract.gang_reasons import incomplete_reason
from shared.dra.claims import InvalidClaim, expected_runtime, gang_name, gang_of
from shared.dra.matching import SelectorMemo

__all__ = ["EXACT_ADMISSIONS", "HORIZON", "REJECTED", "UNSATISFIABLE", "Estimate", "EstimateMemo", "Quantiles",
           "Runtimes", "beyond_horizon", "estimate_starts", "incomplete_gangs", "rfc3339"]

HORIZON = 7 * 86400.0  # how far ahead the forward runs look
EXACT_ADMISSIONS = 300  # per forward run, admitted by the core; the claims after them are extrapolated


@dataclass(frozen=True)
class Estimate:
    """When a waiting claim is expected to be allocated (seconds since the epoch), and what it waits for; p50
    None when nothing can be said (`reason` says why), p90 None when its later run found no start."""

    p50: float | None
    p90: float | None
    blocked_by: tuple[str, ...] = ()
    reason: str | None = None

    def to_json(self) -> dict[str, Any] | None:
        """The contract's estimatedStart: {"p50", "p90", "blockedBy"}, or None when nothing can be said."""
        if self.p50 is None:
            return None
        return {"p50": rfc3339(self.p50), "p90": rfc3339(self.p90) if self.p90 is not None else None,
                "blockedBy": list(self.blocked_by)}

    def status_fields(self) -> dict[str, Any]:
        """What a Pending status carries of it: estimatedStart, and with a null one estimatedStartReason (why
        nothing can be said, a sentence a person can act on)."""
        fields: dict[str, Any] = {"estimatedStart": self.to_json()}
        if self.p50 is None and self.reason:
            fields["estimatedStartReason"] = self.reason
        return fields


def beyond_horizon(horizon: float) -> str:
    """Why a claim that could be placed has no estimate: the forward runs found it no start."""
    return (f"it does not start within {rough_duration(horizon)} of the claims running now, as far as their "
            "runtimes are known (a claim without claimbroker.io/expected-runtime, nor runtimes observed for its "
            "tenant, is taken to run on past that)")


@dataclass
class EstimateMemo:
    """What estimate_starts keeps from one call to the next, as the allocator keeps its KeptState: selector
    results and prepared claims, and the fleet's flavors (derived from the fleet and the claims alone). The
    shell keeps one per estimator; a call without one starts cold."""

    selectors: SelectorMemo = field(default_factory=SelectorMemo)
    flavors: FleetFlavors | None = None
    # the last forward run's state and queue: the next call's first run is brought back from them to its
    # snapshot in O(what changed), as the allocator's cycles go on from each other (None: built anew)
    carried: tuple[KeptState, WaitingQueue] | None = None
    trials: Trials | None = None  # per spec, where it could ever be placed (`Fits`)


def _whole_gangs(started: dict[ClaimKey, Start], waiting: Iterable[Waiting], incomplete: Set[ClaimKey]) -> None:
    """A complete gang's members start together, when the last does, or none does."""
    gangs: dict[tuple[str, str], list[ClaimKey]] = {}
    for w in waiting:
        if w.key not in incomplete and (gang := gang_name(w.claim)) is not None:
            gangs.setdefault((w.tenant, gang), []).append(w.key)
    for members in gangs.values():
        starts = [started.get(key) for key in members]
        if all(s is None for s in starts):
            continue
        if any(s is None for s in starts):
            for key in members:
                started.pop(key, None)
            continue
        last = max((s for s in starts if s is not None), key=lambda s: s.at)
        for key in members:
            started[key] = last


def incomplete_gangs(waiting: Iterable[Waiting]) -> dict[ClaimKey, Estimate]:
    """The members of gangs not all of whose members wait: none starts before the last arrives."""
    gangs: dict[tuple[str, str], tuple[int, list[ClaimKey]]] = {}
    for w in waiting:
        try:
            gang = gang_of(w.claim.metadata.annotations)
        except InvalidClaim:
            continue
        if gang is not None:
            size, members = gangs.setdefault((w.tenant, gang.name), (gang.size, []))
            members.append(w.key)
    out: dict[ClaimKey, Estimate] = {}
    for (_, name), (size, members) in gangs.items():
        if len(members) < size:
            missing = size - len(members)
            estimate = Estimate(None, None, (f"gang {name}: {missing} member{'s' if missing > 1 else ''} missing",),
                                incomplete_reason(name, len(members), size))
            out.update((key, estimate) for key in members)
    return out


def estimate_starts(snapshot: Snapshot, runtimes: Runtimes, *, horizon: float = HORIZON,
                    exact: int = EXACT_ADMISSIONS, memo: EstimateMemo | None = None) -> dict[ClaimKey, Estimate]:
    """An estimate for every waiting claim of `snapshot` (whose `now` must be set), in its order."""
    if snapshot.now is None:
        raise ValueError("estimate_starts needs the snapshot's now")
    gangs = incomplete_gangs(snapshot.waiting)
    memo = memo if memo is not None else EstimateMemo()
    # a run goes on from an earlier run's kept state unless gangs wait: their clocks are kept there too, and
    # would run on from the earlier run's
    reuse = not any(gang_name(w.claim) for w in snapshot.waiting)
    fits = Fits.of(snapshot, memo.selectors, memo.trials)
    memo.trials = fits.trials
    never = fits.never
    hopeless = gangs.keys() | never.keys()
    expected = {w.key: expected_runtime(w.claim) for w in snapshot.waiting}
    sizes = {w.key: size_of(w) for w in snapshot.waiting}
    low = ForwardRun(snapshot, runtimes, 0, horizon, exact, expected, sizes, memo.selectors, memo.flavors, hopeless,
                     memo.carried if reuse else None)
    low.run()
    order = turns(snapshot.waiting)
    flat = {w.key: runtimes.of(w.tenant, (), expected[w.key]) for w in snapshot.waiting}
    extrapolate(low, order, fits, flat)
    memo.flavors = low.kept.flavors
    high = ForwardRun(snapshot, runtimes, 1, horizon, exact, expected, sizes, memo.selectors, memo.flavors,
                      hopeless, (low.kept, low.waiting) if reuse else None)
    high.run()
    extrapolate(high, order, fits, flat)
    memo.carried = (high.kept, high.waiting) if reuse else None
    if not reuse:  # gangs wait: each starts whole, when its last member does (the extrapolation places members)
        for run in (low, high):
            _whole_gangs(run.started, snapshot.waiting, gangs.keys())
    out: dict[ClaimKey, Estimate] = {}
    for w in snapshot.waiting:
        key = w.key
        if key in gangs:
            out[key] = gangs[key]
            continue
        a, b = low.started.get(key), high.started.get(key)
        if a is None and b is None:
            reason = never.get(key) or (REJECTED if key in low.rejected else beyond_horizon(horizon))
            out[key] = Estimate(None, None, (), reason)
            continue
        first = a if a is not None else b
        assert first is not None
        p50 = min(s.at for s in (a, b) if s is not None)
        p90 = max(a.at, b.at) if a is not None and b is not None else None
        out[key] = Estimate(p50, p90, first.blocked_by)
    return out
