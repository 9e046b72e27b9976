"""A compiled selector evaluated under its limits: a deterministic step limit per evaluation (Kubernetes'
runtime cost limit), a limit on the CPU time of one evaluation checked between steps (any thread, no
signals), and a per-selector budget of steps, so a selector that is slow on every device is refused after a
bounded total, not per device. Every failure is a SelectorError."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any

import celpy
import celpy.celtypes as ct
from celpy.evaluation import CELEvalError, Context, Evaluator
from lark import Tree

from shared.dra.cel_cost import bare_identifier, is_bind
from shared.dra.cel_errors import SelectorError, runtime_error, too_deep

# A step is one syntax-tree node evaluated, 5-6 us in cel-python (up to 15 in comprehensions). Normal
# selectors take 16-120 steps; 5,000 steps are 25-80 ms, so this limit, which is deterministic, is the one
# reached. Kubernetes allows 1,000,000 cost units at run time, but cel-go is about 100 times faster.
MAX_STEPS_PER_EVALUATION = 5_000
# The backstop for work between steps (a builtin on a large value). It counts the evaluating thread's CPU
# time less the cyclic GC's, not wall time: a process descheduled or CPU-throttled for 0.1 s, or a full
# collection (200 ms measured in the unit tests' process), must not reject a valid claim.
EVALUATION_TIME_LIMIT_S = 0.1
CHECK_TIME_EVERY = 64  # steps between two clock reads (a clock read is 0.5 us, 64 steps some 400 us)
# The per-selector budget: steps beyond FREE_STEPS_PER_EVALUATION in each evaluation are summed over all
# of a selector's evaluations; past SELECTOR_BUDGET_STEPS (about 0.5 s at 6 us a step) the selector is
# refused. Normal selectors never draw on it, however large the fleet. The budget refills every
# SELECTOR_BUDGET_WINDOW_S: it bounds how long one selector can hold up the allocator at a time, and a
# selector the fleet's slow growth (new devices, new shapes) keeps evaluating is not refused for good.
FREE_STEPS_PER_EVALUATION = 500
SELECTOR_BUDGET_STEPS = 80_000
SELECTOR_BUDGET_WINDOW_S = 60.0


class _Stopped(BaseException):
    """BaseException, so no `except Exception` inside cel-python turns it into an evaluation error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_gc_seconds = 0.0  # time spent in the cyclic GC since import, kept by _time_gc
_gc_started = 0.0


def _time_gc(phase: str, info: dict[str, Any]) -> None:
    global _gc_seconds, _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    else:
        _gc_seconds += time.perf_counter() - _gc_started


gc.callbacks.append(_time_gc)


class _Meter:
    """Steps of one evaluation, against its step limit and deadline: the limits are checked between
    steps, so they work in any thread and leave nothing behind (no signal handler, no timer)."""

    __slots__ = ("checkpoint", "deadline", "gc_before", "limit", "steps")

    def __init__(self, limit: int, seconds: float) -> None:
        self.steps = 0
        self.limit = limit
        self.deadline = time.thread_time() + seconds
        self.gc_before = _gc_seconds
        self.checkpoint = min(limit, CHECK_TIME_EVERY)

    def check(self) -> None:
        if self.steps > self.limit:
            raise _Stopped("steps")
        if time.thread_time() - (_gc_seconds - self.gc_before) > self.deadline:
            raise _Stopped("time")
        self.checkpoint = min(self.limit, self.steps + CHECK_TIME_EVERY)


class _Evaluator(Evaluator):
    """cel-python's evaluator, metered per node, with `cel.bind` evaluated natively: the variable holds
    init's value (or its error, which `||` and `&&` absorb as usual), evaluated once, in its own scope."""

    def __init__(self, ast: Tree[Any], activation: Any, meter: _Meter) -> None:
        super().__init__(ast, activation)
        self.meter = meter

    def sub_evaluator(self, ast: Tree[Any]) -> _Evaluator:
        return _Evaluator(ast, self.activation, self.meter)

    def visit_children(self, tree: Tree[Any]) -> list[Any]:
        meter = self.meter
        meter.steps += 1
        if meter.steps >= meter.checkpoint:
            meter.check()
        visit = self.visit
        return [visit(child) if isinstance(child, Tree) else child for child in tree.children]

    def member_dot_arg(self, tree: Tree[Any]) -> Any:
        if not is_bind(tree):
            return super().member_dot_arg(tree)
        variable, init, body = tree.children[2].children
        try:
            value = self.visit(init)
        except CELEvalError as error:
            value = error
        nested = self.sub_evaluator(body)
        nested.set_activation({str(bare_identifier(variable)): value})
        return nested.visit(body)


class _Runner(celpy.InterpretedRunner):
    def evaluate(self, activation: Context, meter: _Meter | None = None) -> ct.Value:
        if meter is None:
            meter = _Meter(MAX_STEPS_PER_EVALUATION, EVALUATION_TIME_LIMIT_S)
        return _Evaluator(self.ast, self.new_activation(), meter).evaluate(activation)


ENVIRONMENT = celpy.Environment(runner_class=_Runner)


@dataclass
class EvaluationBudget:
    """Steps a selector may spend beyond FREE_STEPS_PER_EVALUATION per evaluation, summed over its
    evaluations: bounds what one selector can cost a fleet (0.5 s, not 0.1 s per device)."""

    limit: int = SELECTOR_BUDGET_STEPS
    spent: int = 0
    evaluations: int = 0
    since: float = field(default_factory=time.monotonic)  # when this window began

    def refill(self, now: float) -> None:
        if now - self.since >= SELECTOR_BUDGET_WINDOW_S:
            self.spent, self.evaluations, self.since = 0, 0, now

    def exceeded(self) -> str:
        return (f"CEL evaluation budget exceeded: this selector spent {self.spent:,} steps beyond "
                f"{FREE_STEPS_PER_EVALUATION} per device over {self.evaluations} evaluations, the limit is "
                f"{self.limit:,} (about 0.5 s) a minute; it is too expensive to evaluate on every device")


@dataclass(frozen=True)
class CompiledSelector:
    expression: str
    program: Any
    names: frozenset[str] | None  # identifiers the expression reads; None means "the whole device"
    budget: EvaluationBudget = field(default_factory=EvaluationBudget, compare=False, repr=False)


def _names(activation: ct.MapType) -> list[str]:
    """The attribute and capacity names of the device, every domain's (what a typo is compared with)."""
    names: list[str] = []
    for section in ("attributes", "capacity"):
        domains = activation.get(ct.StringType(section))
        for by_name in (domains.values() if isinstance(domains, ct.MapType) else ()):
            names.extend(str(name) for name in (by_name.keys() if isinstance(by_name, ct.MapType) else ()))
    return names


def evaluate(selector: CompiledSelector, activation: ct.MapType, budget: EvaluationBudget | None = None) -> bool:
    """True or False; anything else (a runtime error, a non-bool result, a limit reached) raises
    SelectorError. `budget` defaults to the selector's own, kept for as long as the selector is cached."""
    budget = selector.budget if budget is None else budget
    budget.refill(time.monotonic())
    remaining = budget.limit - budget.spent
    if remaining <= 0:
        raise SelectorError(budget.exceeded())
    step_limit = min(MAX_STEPS_PER_EVALUATION, FREE_STEPS_PER_EVALUATION + remaining)
    meter = _Meter(step_limit, EVALUATION_TIME_LIMIT_S)
    try:
        try:
            result = selector.program.evaluate({"device": activation}, meter)
        finally:
            budget.spent += max(0, meter.steps - FREE_STEPS_PER_EVALUATION)
            budget.evaluations += 1
    except _Stopped as stop:
        if stop.reason == "time":
            raise SelectorError(f"CEL evaluation stopped after {EVALUATION_TIME_LIMIT_S:g}s of CPU time: the "
                                "expression is too expensive to evaluate") from None
        if step_limit < MAX_STEPS_PER_EVALUATION:
            raise SelectorError(budget.exceeded()) from None
        raise SelectorError(f"CEL evaluation stopped after {step_limit:,} steps, the limit for one device: the "
                            "expression is too expensive to evaluate; iterate over fewer elements") from None
    except CELEvalError as error:
        raise SelectorError(runtime_error(error, _names(activation))) from None
    except RecursionError:
        raise SelectorError(too_deep("it ran out of stack while being evaluated")) from None
    except MemoryError:
        raise
    except Exception as error:  # a claim's text must never crash the allocator
        raise SelectorError(f"CEL runtime error: {type(error).__name__}: {error}") from None
    if isinstance(result, CELEvalError):
        raise SelectorError(runtime_error(result, _names(activation)))
    if not isinstance(result, bool | ct.BoolType):
        raise SelectorError(f"CEL expression must evaluate to bool, got {type(result).__name__}")
    return bool(result)
