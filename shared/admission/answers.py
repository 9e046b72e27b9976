"""The answers a cycle gives: a decided claim's final answer and, when it waits, why; and when an answer
is due (one that says the claim's search was cut short waits for CUT_PATIENCE cycles in a row).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from shared.admission.claim_guard import per_claim
from shared.admission.explain import Alike, Explainer, cut_explanation
from shared.admission.groups import WaitingGroups
from shared.admission.model import Block, ClaimKey, Waiting
from shared.admission.placement_budget import PlacementBudget
from shared.admission.quota_book import QuotaBook
from shared.admission.trial_admission import TrialAdmission, quota_blocked
from shared.dra.allocation import FleetState
from shared.dra.budget import CUT_PATIENCE, BudgetExceeded
from shared.dra.plan import Plan
from shared.dra.results import Decision, Rejected, State

FREED = Decision(State.PENDING, reason="devices or quota were freed in this cycle; it is tried again in the next")


class Answers:
    """What the claims a cycle decided are told. A Pending answer from the admission pass carries no reason
    (a trial's, or `UNANSWERED`): it is worked out once the cycle has decided, against what is free and
    what quota is left then, one placement per spec."""

    def __init__(self, placement: FleetState, book: QuotaBook, queue: WaitingGroups, trials: TrialAdmission,
                 budget: PlacementBudget, explainer: Explainer) -> None:
        self.placement = placement
        self.book = book
        self.queue = queue
        self.trials = trials
        self.budget = budget
        self.explainer = explainer
        self.placed_after: dict[int, Decision] = {}  # per plan: its placement once the cycle decided (answer())
        # per waiting claim: when the first claim it could preempt leaves its minRuntime (time, tenant, rule)
        self.preemptible_from: dict[ClaimKey, tuple[float, str, str]] = {}
        self.cut_streak: dict[ClaimKey, int] = {}  # per claim: cycles in a row its work was cut short

    def new_cycle(self) -> None:
        self.placed_after = {}
        self.preemptible_from = {}

    def forget(self, plan: Plan) -> None:
        self.placed_after.pop(id(plan), None)

    def left(self, waiting: Waiting) -> None:
        """The claim left the queue."""
        self.cut_streak.pop(waiting.key, None)

    def note_wait(self, preemptor: Waiting, tenant: str, rule: str, free_at: float) -> None:
        """A claim `preemptor` could preempt under `rule` but for its tenant's minRuntime: the earliest
        such claim is named in the preemptor's answer."""
        known = self.preemptible_from.get(preemptor.key)
        if known is None or free_at < known[0]:
            self.preemptible_from[preemptor.key] = (free_at, tenant, rule)

    def answer(self, waiting: Waiting, decision: Decision, blocks: list[Block]) -> tuple[Decision, list[Block]]:
        """The answer to give: a Pending answer from the pass carries no reason (a trial's, or
        `UNANSWERED`), so it is worked out now, against what is free and what quota is left after the cycle."""
        if decision.state is not State.PENDING or decision.reason is not None:
            return decision, blocks
        gid = self.queue.group_of.get(waiting.key)  # its group is of its tenant and plan
        plan_id = gid[1] if gid is not None else None
        explained = self.placed_after.get(plan_id) if plan_id is not None else None
        if explained is None:  # nothing moves once the cycle has decided: one placement per spec
            explained = self.trials.decide(waiting, None, explain=True)
            if plan_id is not None:
                self.placed_after[plan_id] = explained
        if explained.allocation is None:
            return explained, []  # capacity keeps it out
        if self.book.config.enforced:  # whichever way the pass found it out, its quota may keep it out now
            blocks = self.book.check(waiting.tenant, self.trials.deltas(explained.allocation))
            if blocks:
                return quota_blocked(blocks)
        return FREED, []  # devices freed by this cycle's preemptions, or quota returned by them

    @per_claim
    def settle(self, waiting: Waiting, decision: Decision, blocks: list[Block], alike: Alike
               ) -> tuple[Decision, Mapping[str, Any] | None]:
        """The answer a decided claim is given and, when it waits, why (`shared.admission.explain`); the
        work of explaining is its tenant's too, and a claim cut short by its budget is not explained further."""
        if decision.cut:
            return decision, cut_explanation(waiting, decision)
        with self.budget.paying(waiting):
            try:
                return self._settle(waiting, decision, blocks, alike)
            except BudgetExceeded:
                self.budget.deferred += 1
                cut = Decision(State.PENDING, reason=self.placement.cut_reason(self._plan_or_none(waiting)),
                               cut=True)
                return cut, cut_explanation(waiting, cut)

    def _plan_or_none(self, waiting: Waiting) -> Plan | None:
        try:
            return self.placement.plan(waiting.claim)
        except (Rejected, BudgetExceeded):
            return None

    def _settle(self, waiting: Waiting, decision: Decision, blocks: list[Block], alike: Alike
                ) -> tuple[Decision, Mapping[str, Any] | None]:
        decision, blocks = self.answer(waiting, decision, blocks)
        if decision.cut:
            return decision, cut_explanation(waiting, decision)
        if decision.state is State.PENDING:
            if (free := self.preemptible_from.get(waiting.key)) is not None:
                at, tenant, rule = free
                when = datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")
                decision = replace(decision, reason=f"{decision.reason}; {rule} preemption of {tenant}'s claims "
                                                    f"possible from {when} UTC, when their minRuntime ends")
            return decision, self.explainer.pending(waiting, decision, blocks, alike)
        return decision, None

    def due(self, waiting: Waiting, decision: Decision) -> bool:
        """Whether to give this answer now. A decision its budget cut short is given only once the claim's
        work has been cut short CUT_PATIENCE cycles in a row: an ordinary claim whose selectors are new is
        done within a few cycles and never says its search exceeded a budget; an expensive one says so soon.
        Any other answer is due at once."""
        if not decision.cut:
            self.cut_streak.pop(waiting.key, None)
            return True
        streak = self.cut_streak[waiting.key] = self.cut_streak.get(waiting.key, 0) + 1
        return streak >= CUT_PATIENCE
