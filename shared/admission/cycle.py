"""One admission cycle: quotas per flavor, fair-share order, preemption that cannot loop, explanations.

A pure function over an immutable snapshot (the fleet, the quotas, what runs, what waits); the
allocator service and `claimbroker simulate --quotas` run the same code.

- Flavors: every device counts against the first flavor whose selector accepts it (shared/admission/quota.py).
- Quotas (Kueue's arithmetic, flat cohorts): a tenant may use its nominal quota of a flavor, less what
  cohort-mates borrow of what it lends (it takes that back by reclaim, not by being admitted beside
  them: the cohort would then hold more than its members' nominal); beyond it it borrows what its cohort
  lends (each member lends its unused nominal up to its lendingLimit) and the flavor's free capacity
  (devices no tenant's nominal covers), within its borrowingLimit. With no quota anywhere the fleet is
  open. `shared.admission.invariant` checks what users rely on.
- Nested cohorts (KEP-79, only when a cohort has a parent or quotas of its own): the same arithmetic
  level by level (`QuotaBook._available_tree`): a subtree draws on its parent's pool within its
  borrowingLimit and lends it at most its lendingLimit; top cohorts share only the free capacity.
- Order: tenants by share (GPU units in use over weight, lowest first; with fairSharing.halfLife, plus
  past use: shared/admission/past_use.py), then priority, then arrival.
  Claims of one tenant and spec form a group tried from its head (see `passes.admission_pass`), so a deep
  queue never stalls admission and costs a cycle O(groups + admissions), not O(claims).
- Placement within nominal first: devices of flavors where the tenant has nominal headroom, then the
  best fit it may borrow (or, when the best fit is blocked, another flavor it may borrow).
- Preemption, only of preemptible claims, by three rules: (a) priority within a tenant, (b) reclaim: a
  tenant that stays within its nominal takes back devices another tenant of its cohort borrows (in a
  tree: its side under the nearest cohort it shares with the borrower stays within that side's nominal,
  and the nearest borrowers go first, kueue PR#4806's borrowing distance), (c)
  fair share: a tenant preempts a borrowing tenant only while its share afterwards stays at or below
  the victim's share afterwards. (b) and (c) only take from borrowers and (c) compares shares after
  the move; and a claim never preempts one that preempted it (`displaced_by`), so no pair of claims
  is preempted back and forth, whatever else changes between cycles. Claims admitted in a cycle are
  not preempted in the same cycle. A claim its quota keeps out whatever other tenants' claims are
  evicted preempts only within its tenant. The victim set is the smallest that lets the claim in:
  fewest GPU units, then lowest priority, then most recently allocated, and no victim the claim does
  not need.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from shared.admission.claim_guard import MAX_FAULTS_PER_CYCLE, ClaimFault, fault_decision
from shared.admission.explain import Alike
from shared.admission.gang_pass import preempt_for_gang, release_reserved
from shared.admission.holdings import allocated_devices
from shared.admission.kept import KeptState
from shared.admission.model import MAX_PREEMPTION_ATTEMPTS, ClaimDecision, ClaimKey, CycleResult, Snapshot
from shared.admission.passes import admission_pass, preemptors
from shared.admission.preemption import try_preempt
from shared.dra.results import Decision, DeviceKey, State


def run_cycle(snapshot: Snapshot, kept: KeptState | None = None) -> CycleResult:
    """Admit what fits in fair-share order, then preempt where a rule allows, and explain the rest.

    Decisions cover every claim admitted, Rejected or tried, and every claim without an answer yet;
    a claim that keeps waiting behind a head of its kind keeps its last answer.

    The one guarded place per claim: when deciding a claim fails (`shared.admission.claim_guard`), that claim gets
    its fault's decision and the cycle is decided again without it, on state built anew (what was kept
    may be half updated), so no claim can stop the others."""
    kept = kept if kept is not None else KeptState()
    faulty: dict[ClaimKey, ClaimDecision] = {}
    current = snapshot
    while True:
        try:
            result = _decide_cycle(current, kept)
        except ClaimFault as fault:
            if fault.key in faulty or len(faulty) >= MAX_FAULTS_PER_CYCLE:
                raise  # not one claim's fault: the shell reports the cycle's failure
            decision, internal = fault_decision(fault)
            faulty[fault.key] = ClaimDecision(fault.key[0], fault.key[1], decision, internal_error=internal)
            kept.forget_cycle()
            current = replace(snapshot, waiting=tuple(w for w in snapshot.waiting if w.key not in faulty),
                              changes=None)
            continue
        if faulty:
            result = replace(result, decisions=result.decisions + tuple(faulty.values()))
        return result


def _decide_cycle(snapshot: Snapshot, kept: KeptState) -> CycleResult:
    cycle = kept.admission_for(snapshot)
    decided, order = admission_pass(cycle)
    queue = cycle.queue
    gang_invalid = cycle.gangs.invalid
    for key in sorted(queue.invalid):  # claims Rejected as written, or that their tenant may not send
        waiting = queue.waiting[key]
        if gang_invalid and (why := gang_invalid.get(key)) is not None:  # its gang annotations do not read
            decided.append((waiting, Decision(State.REJECTED, reason=why), []))
            continue
        decided.append((waiting, cycle.trials.decide(waiting, None, explain=False), []))
    for waiting in queue.unprepared.values():  # their selectors cost more than their tenant had left
        if not waiting.answered:
            decided.append((waiting, Decision(State.PENDING, reason=cycle.placement.cut_reason(None), cut=True), []))
    for waiting in itertools.islice(preemptors(cycle, order), MAX_PREEMPTION_ATTEMPTS):
        preempted = try_preempt(cycle, waiting)
        if preempted is not None:
            decided.append((waiting, preempted, []))
    for unit in cycle.gangs.refused_now[:MAX_PREEMPTION_ATTEMPTS]:  # gangs preempt whole, or not at all
        decided.extend(preempt_for_gang(cycle, unit))
    final = {w.key: (w, d, b) for w, d, b in decided}  # a claim admitted by preemption: its last answer
    results = []
    alike = Alike(cycle.holdings.preemptible())  # preemptible claims running
    flavors: dict[DeviceKey, tuple[str | None, float]] = {}
    answers, answered_cut = cycle.answers, cycle.queue.answered_cut
    for waiting, decision, blocks in final.values():
        decision, detail = answers.settle(waiting, decision, blocks, alike)
        if not answers.due(waiting, decision):
            continue  # its work was cut short only a few cycles in a row: it is answered once it is done
        answered_cut(waiting, decision.cut)  # whether its answer says its search was cut short
        if decision.allocation is not None:
            for d in allocated_devices(cycle.fleet, decision.allocation):
                flavors[d.key] = (cycle.flavors.name_of(d), cycle.flavors.units_of(d))
        results.append(ClaimDecision(waiting.tenant, waiting.name, decision, detail))
    if cycle.gangs.held_now:
        release_reserved(cycle)
    units = cycle.book.units_in_use() if snapshot.quotas.half_life > 0 else {}
    return CycleResult(tuple(results), tuple(cycle.preemptions), flavors, cycle.budget.deferred, units)
