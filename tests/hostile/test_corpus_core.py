"""The hostile corpus through the pure path: read_submission, then the decision core over the built-in fleet.

For every submit case: no exception escapes but InvalidClaim from read_submission; a claim it reads is
decided in a cycle with a normal one-GPU claim of the same tenant, which must still be Allocated (poison
isolation); Rejected and Pending decisions carry a reason; the case's expectation holds. Then all hostile
claims are queued together with 20 valid claims, which must all be decided (batch-mates). Every case, release
messages and bad subjects included, also goes through the allocator's `read_message`, which must never
raise. Each case runs in a forked child (tests/hostile/isolate.py): a crash or a hang is reported against
the case and the run goes on. `pytest -s` prints the outcome counts; SUMMARY holds them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from services.allocator.messages import ClaimMessage, read_message
from shared.admission.kept import KeptState
from shared.dra import model as dra
from shared.dra.claims import InvalidClaim, read_submission
from tests.hostile import corpus
from tests.hostile.core import (
    MAX_REASON,
    busy_fleet,
    decide_with_companion,
    internal_error,
    reason_problems,
    settle,
    waiting,
)
from tests.hostile.corpus import CLASSES, Case, normal_claim
from tests.hostile.isolate import Crash, crash_of, run_isolated

CASES = corpus.build()
SUBMITS = [c for c in CASES if c.action == "submit"]
CASE_TIMEOUT_S = 15.0  # a cycle that hits the CEL guard takes about 1 s; nothing should take 15
BATCH_TIMEOUT_S = 60.0
# internal-error: the core's guard caught an exception of its own while deciding the claim (a crash it
# contained: the claim waits with an "internal error" reason instead of the answer it should get).
OUTCOMES = ("allocated", "pending", "rejected", "invalid-named", "invalid-message", "internal-error", "crash")
GUARDED_READ = "message could not be read:"  # read_message's catch-all (services/allocator/messages.py)

MEMO = KeptState()  # kept across cycles as the allocator keeps it; each child starts from its state here
RUNNING = busy_fleet(MEMO)

# What ran: outcome counts per class, and the crashes with where they escaped (quoted by the closing note).
SUMMARY: dict[str, Any] = {"core": {k: Counter() for k in CLASSES}, "read_message": Counter(),
                           "crashes": {}, "unexpected": {}, "guarded": {}}


def decide_case(case: Case) -> dict[str, Any]:
    """In the child: read the case, decide it next to a normal claim; what happened, as plain data."""
    try:
        claim = read_submission(case.payload, case.subject_tenant)
    except InvalidClaim as invalid:
        reason = str(invalid)
        problems = [] if reason else ["InvalidClaim without a message"]
        if len(reason) > MAX_REASON:
            problems.append(f"InvalidClaim's message is {len(reason):,} characters")
        return {"outcome": "invalid-named" if invalid.name else "invalid-message", "reason": reason[:500],
                "problems": problems}
    return decide_with_companion(claim, MEMO, RUNNING)


def _expected(case: Case, outcome: str) -> bool:
    meaning = {"allocated": "accepted", "pending": "accepted", "rejected": "rejected",
               "invalid-named": "invalid", "invalid-message": "invalid"}.get(outcome)
    if meaning is None:
        return False
    # "rejected" means refused either way: at read time (InvalidClaim) or by the core.
    return case.allows(meaning) or (meaning == "invalid" and case.allows("rejected"))  # type: ignore[arg-type]


@pytest.mark.parametrize("case", SUBMITS, ids=lambda c: c.id)
def test_submission_is_decided_and_isolated(case: Case) -> None:
    answer = run_isolated(decide_case, case, timeout=CASE_TIMEOUT_S)
    if isinstance(answer, Crash):
        SUMMARY["core"][case.klass]["crash"] += 1
        SUMMARY["crashes"][case.id] = str(answer)
        pytest.fail(f"{case.id}: {'an exception escaped' if answer.kind not in ('Timeout', 'Died') else 'no answer'}:"
                    f" {answer}", pytrace=False)
    outcome = answer["outcome"]
    SUMMARY["core"][case.klass][outcome] += 1
    failures = list(answer["problems"])
    if not _expected(case, outcome):
        failures.append(f"expected {case.expect}{''.join(' or ' + a for a in case.alternatives)}, got {outcome}: "
                        f"{answer['reason']!r}")
        SUMMARY["unexpected"][case.id] = f"expected {case.expect}, got {outcome}: {(answer['reason'] or '')[:200]!r}"
    if "companion" in answer and answer["companion"] != "Allocated":
        failures.append(f"the normal claim in the same cycle is {answer['companion']} "
                        f"({answer['companion_reason']!r}): the hostile claim poisoned its cycle")
    assert not failures, f"{case.id}: " + "; ".join(failures)


def decide_batch() -> dict[str, Any]:
    """In the child: every hostile claim that reads, and 20 valid claims between them, queued together."""
    claims: dict[tuple[str, str], dra.ResourceClaim] = {}
    for case in SUBMITS:
        try:
            claim = read_submission(case.payload, case.subject_tenant)
        except InvalidClaim:
            continue
        claims.setdefault((claim.metadata.namespace or "default", claim.metadata.name), claim)
    hostile = list(claims.values())
    mates = [read_submission(normal_claim(f"mate-{i:02d}"), f"t{1 + i % 4}") for i in range(20)]
    queue: list[dra.ResourceClaim] = []
    left = list(mates)
    step = max(1, len(hostile) // len(mates))
    for index, claim in enumerate(hostile):
        if index % step == 0 and left:
            queue.append(left.pop(0))
        queue.append(claim)
    queue += left
    waitings = tuple(waiting(c, 2000 + i) for i, c in enumerate(queue))
    decisions = settle(RUNNING, waitings, MEMO)
    decided = {(d.tenant, d.name): d.decision for d in decisions}
    internal = [f"{d.tenant}/{d.name}" for d in decisions if internal_error(d)]
    mate_states = {}
    for mate in mates:
        decision = decided.get((mate.metadata.namespace or "", mate.metadata.name))
        mate_states[mate.metadata.name] = (decision.state.value, decision.reason) if decision else None
    return {"hostile": len(hostile), "queued": len(waitings), "mates": mate_states,
            "problems": reason_problems(decisions) + [f"internal errors: {internal}"] * bool(internal)}


def test_hostile_claims_do_not_hold_back_their_batch_mates() -> None:
    answer = run_isolated(decide_batch, timeout=BATCH_TIMEOUT_S)
    if isinstance(answer, Crash):
        SUMMARY["crashes"]["<batch of all hostile claims>"] = str(answer)
        pytest.fail(f"every hostile claim queued with and 20 valid ones: {answer}", pytrace=False)
    assert answer["queued"] == answer["hostile"] + 20
    undecided = {name: state for name, state in answer["mates"].items()
                 if state is None or state[0] not in ("Allocated", "Pending") or not (state[0] == "Allocated"
                                                                                      or state[1])}
    assert not undecided, f"valid claims not decided next to {answer['hostile']} hostile ones: {undecided}"
    assert not answer["problems"], answer["problems"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.action}-{c.id}")
def test_read_message_never_raises(case: Case) -> None:
    message_id = f"hostile:{case.id}"
    try:
        message = read_message(case.subject, case.payload, message_id)
    except Exception as error:  # whatever escapes is the finding
        crash = crash_of(error)
        SUMMARY["read_message"]["crash"] += 1
        SUMMARY["crashes"][f"read_message {case.subject} {case.id}"] = str(crash)
        pytest.fail(f"read_message({case.subject!r}, <{case.id}>) raised {crash}", pytrace=False)
    assert isinstance(message, ClaimMessage)
    SUMMARY["read_message"]["invalid" if message.invalid is not None else "read"] += 1
    if message.invalid is not None and str(message.invalid).startswith(GUARDED_READ):
        SUMMARY["read_message"]["guarded"] += 1  # refused, but by the catch-all: the reason names an exception
        SUMMARY["guarded"][f"read_message {case.id}"] = str(message.invalid)[:300]
    if message.invalid is not None:
        assert str(message.invalid), "an invalid message says why"
        assert len(str(message.invalid)) <= MAX_REASON, f"a {len(str(message.invalid)):,}-character reason"
    if case.expect == "invalid" and not case.alternatives:
        assert message.invalid is not None, f"{case.id} on {case.subject!r} was read as {message}"
    if case.action == "release" and case.expect == "accepted":
        assert message.invalid is None and message.name == case.name
    if case.action == "submit" and case.expect == "accepted" and not case.alternatives:
        assert message.claim is not None and message.invalid is None, message.invalid


def summary_text() -> str:
    lines = ["hostile corpus outcomes (core: read_submission + run_cycle)",
             f"{'class':<12}" + "".join(f"{o:>16}" for o in OUTCOMES)]
    total: Counter[str] = Counter()
    for klass in CLASSES:
        counts = SUMMARY["core"][klass]
        total.update(counts)
        lines.append(f"{klass:<12}" + "".join(f"{counts[o]:>16}" for o in OUTCOMES))
    lines.append(f"{'all':<12}" + "".join(f"{total[o]:>16}" for o in OUTCOMES))
    lines.append(f"read_message: {dict(SUMMARY['read_message'])}")
    lines.append(f"unexpected outcomes: {len(SUMMARY['unexpected'])}")
    for key, why in SUMMARY["unexpected"].items():
        lines.append(f"  {key}: {why}")
    lines.append(f"refused by read_message's catch-all (an exception it contained): {len(SUMMARY['guarded'])}")
    for key, why in SUMMARY["guarded"].items():
        lines.append(f"  {key}: {why}")
    lines.append(f"crashes: {len(SUMMARY['crashes'])}")
    for key, crash in SUMMARY["crashes"].items():
        lines.append(f"  {key}: {crash}")
    return "\n".join(lines)


def test_outcome_summary() -> None:
    """Runs last in this module: prints what the cases above gave (pytest -s)."""
    SUMMARY["text"] = summary_text()
    print("\n" + SUMMARY["text"])
