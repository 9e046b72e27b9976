"""Device selectors in CEL, evaluated the way Kubernetes DRA evaluates them.

Programs are compiled once per expression text and cached (a bounded cache). A selector's result depends only on the
device fields its expression names, so results are memoised per distinct tuple of those values:
a fleet of 1,000 identical H100s costs one evaluation, not 1,000 (cel-python needs 0.25-0.8 ms each).

A selector is the claim's own text and must never crash or stall the allocator, so everything is bounded
before and while it runs, and every failure is a SelectorError (the allocator makes the claim Rejected):
- before parsing: 10 KiB of text (Kubernetes' limit) and at most MAX_NESTING nested brackets;
- after parsing: a syntax tree at most MAX_TREE_DEPTH deep (cel-python evaluates recursively, about five
  Python frames per level), and an estimated worst-case cost of at most MAX_COST that accounts for
  comprehensions, `cel.bind` and the sizes of strings and lists they build;
- while running: a deterministic step limit per evaluation (Kubernetes' runtime cost limit), a limit on
  the CPU time of one evaluation checked between steps (any thread, no signals), and a per-selector budget
  of steps so a selector that is slow on every device is refused after a bounded total, not per device.
"""

from __future__ import annotations

import gc
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import celpy.celtypes as ct
from celpy.evaluation import CELEvalError, Context, Evaluator
from lark import Tree

from shared.dra.budget import COMPILE, Meter
from shared.dra.cel_rewrite import rewrite
from shared.dra.model import MAX_CEL_LENGTH
from shared.dra.quantity import Quantity, parse_quantity

GUARD_HINT = (
    "consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() "
    "for optional fields"
)


class SelectorError(ValueError):
    """A selector that cannot be evaluated: the claim or class is wrong, not the fleet. `str()` is one line
    (a status reason, an API's detail); `pointed` adds the expression with a caret under the error where
    one is known (a file check on a terminal)."""

    def __init__(self, message: str, pointed: str | None = None) -> None:
        super().__init__(message)
        self.pointed = pointed or message


class _DefaultingMap(ct.MapType):
    """device.attributes / device.capacity: an unknown domain reads as an empty map, as in Kubernetes."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return ct.MapType({})


class CelQuantity:
    """Opaque CEL value for Kubernetes quantities; methods are dispatched by the functions below."""

    __slots__ = ("q",)

    def __init__(self, q: Quantity) -> None:
        self.q = q

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CelQuantity) and self.q == other.q

    def __hash__(self) -> int:
        return hash(self.q)


@dataclass(frozen=True, order=True)
class SemVer:
    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, text: str) -> SemVer:
        match = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$", str(text))
        if not match:
            raise ValueError(f"invalid semver {text!r}")
        return cls(int(match[1]), int(match[2]), int(match[3]))


def _cmp(a: Any, b: Any) -> int:
    left = a.q.value if isinstance(a, CelQuantity) else a
    right = b.q.value if isinstance(b, CelQuantity) else b
    if type(left) is not type(right) and not (isinstance(a, CelQuantity) and isinstance(b, CelQuantity)):
        raise TypeError(f"no such overload: cannot compare {type(a).__name__} with {type(b).__name__}")
    return (left > right) - (left < right)


_INT64 = range(-(2**63), 2**63)


def _parse_quantity(text: Any) -> Quantity:
    return parse_quantity(str(text))  # bounded: a huge exponent is refused, not computed


def _quantity(text: Any) -> CelQuantity:
    return CelQuantity(_parse_quantity(text))


def _is_quantity(text: Any) -> ct.BoolType:
    try:
        _parse_quantity(text)
    except ValueError:
        return ct.BoolType(False)
    return ct.BoolType(True)


def _as_integer(a: Any) -> ct.IntType:
    value = a.q.value
    if value.denominator != 1 or value.numerator not in _INT64:
        raise ValueError(f"quantity {a.q.text} cannot be converted to an int64")
    return ct.IntType(value.numerator)


def _semver(text: Any) -> SemVer:
    return SemVer.parse(str(text))


def _is_semver(text: Any) -> ct.BoolType:
    try:
        SemVer.parse(str(text))
    except ValueError:
        return ct.BoolType(False)
    return ct.BoolType(True)


FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": lambda a, b: ct.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: ct.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: ct.BoolType(_cmp(a, b) < 0),
    "asInteger": _as_integer,
    "isInteger": lambda a: ct.BoolType(a.q.value.denominator == 1 and a.q.value.numerator in _INT64),
    "asApproximateFloat": lambda a: ct.DoubleType(float(a.q.value)),
    "sign": lambda a: ct.IntType((a.q.value > 0) - (a.q.value < 0)),
    "add": lambda a, b: CelQuantity(Quantity.of(a.q.value + (b.q.value if isinstance(b, CelQuantity) else b))),
    "sub": lambda a, b: CelQuantity(Quantity.of(a.q.value - (b.q.value if isinstance(b, CelQuantity) else b))),
    "major": lambda v: ct.IntType(v.major),
    "minor": lambda v: ct.IntType(v.minor),
    "patch": lambda v: ct.IntType(v.patch),
}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# Expressions that iterate over maps can read any attribute: they get the whole device as their key.
_ITERATES = re.compile(r"\.(exists|exists_one|all|map|filter)\s*\(|\bin\s+device\b|\bsize\s*\(")

# Limits. Kubernetes refuses selectors over 10 KiB (MAX_CEL_LENGTH) or with an estimated cost over
# 1,000,000, and stops an evaluation at a runtime cost limit; cel-python has none of these. The estimate
# here counts cel-python's syntax-tree nodes, several per cel-go cost unit: stricter for the same text.
MAX_COST = 1_000_000
# Each nesting level is about 5 Python frames when cel-python evaluates (measured on 3.11: 4.5 for
# brackets, 5.0 for chained operators and unary minus); celpy raises the recursion limit to 2,500, so
# 250 levels use about 1,250 frames and leave as many to the caller. Each pair of brackets costs 9 to 11
# levels, each chained operator (&&, ||, +) or unary operator one.
MAX_TREE_DEPTH = 250
# More nested brackets than this always make a tree deeper than MAX_TREE_DEPTH: refused before parsing
# (lark needs 0.3 s for 5,000 nested parentheses).
MAX_NESTING = 32
# A step is one syntax-tree node evaluated, 5-6 us in cel-python (up to 15 in comprehensions). Normal
# selectors take 16-120 steps; 5,000 steps are 25-80 ms, so this limit, which is deterministic, is the one
# reached. Kubernetes allows 1,000,000 cost units at run time, but cel-go is about 100 times faster.
MAX_STEPS_PER_EVALUATION = 5_000
# The backstop for work between steps (a builtin on a large value). It counts the evaluating thread's CPU
# time less the cyclic GC's, not wall time: a process descheduled or CPU-throttled for 0.1 s, or a full
# collection (200 ms measured in the unit tests' process), must not reject a valid claim.
EVALUATION_TIME_LIMIT_S = 0.1
_CHECK_TIME_EVERY = 64  # steps between two clock reads (a clock read is 0.5 us, 64 steps some 400 us)
# The per-selector budget: steps beyond FREE_STEPS_PER_EVALUATION in each evaluation are summed over all
# of a selector's evaluations; past SELECTOR_BUDGET_STEPS (about 0.5 s at 6 us a step) the selector is
# refused. Normal selectors never draw on it, however large the fleet. The budget refills every
# SELECTOR_BUDGET_WINDOW_S: it bounds how long one selector can hold up the allocator at a time, and a
# selector the fleet's slow growth (new devices, new shapes) keeps evaluating is not refused for good.
FREE_STEPS_PER_EVALUATION = 500
SELECTOR_BUDGET_STEPS = 80_000
SELECTOR_BUDGET_WINDOW_S = 60.0

_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_UNKNOWN_SIZE = 48  # DRA's most values in one list attribute; maps of attributes hold at most 32
_UNKNOWN_LENGTH = 64  # DRA's longest string or version attribute value
_CAP = 10**15  # estimates beyond any limit: keeps the arithmetic on small ints
# Single-child nodes that only carry precedence: passed through without recursion.
_WRAPPERS = frozenset({"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication",
                       "unary", "member", "primary", "paren_expr"})
_SCALAR_METHODS = frozenset({"contains", "startsWith", "endsWith", "matches", "size", "compareTo",
                             "isGreaterThan", "isLessThan", "asInteger", "isInteger", "asApproximateFloat",
                             "sign", "add", "sub", "major", "minor", "patch"})
_SIZED_FUNCTIONS = frozenset({"dyn", "string", "bytes", "list", "map"})  # results as large as their argument


def _too_deep(what: str) -> str:
    return (f"CEL expression nested too deeply: {what}; each pair of brackets adds about 10 levels, each "
            "chained operator (&&, ||, +) one: flatten it or split it into several selectors")


def _bracket_nesting(text: str) -> int:
    """The deepest bracket nesting outside string literals, scanned as cel-python's lexer reads strings
    (a backslash escapes the next character, also in raw strings)."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"' or ch == "'":
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if text[i] == "\\" else 1
            i += len(quote)
            continue
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
        i += 1
    return deepest


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the estimate knows of a value: its footprint (characters of a string, elements of a list or
    map, nested ones included), how many elements a comprehension over it visits, and its elements'
    shape (None: unknown, a device value)."""

    size: int
    count: int
    item: _Shape | None = None


_SCALAR = _Shape(1, 0)
_UNKNOWN = _Shape(_UNKNOWN_LENGTH, _UNKNOWN_SIZE)
_EMPTY = _Shape(0, 0, _SCALAR)


def _shape(size: int, count: int, item: _Shape | None) -> _Shape:
    return _Shape(min(size, _CAP), min(count, _CAP), item)


def _item(shape: _Shape) -> _Shape:
    return shape.item if shape.item is not None else _UNKNOWN


def _join(a: _Shape, b: _Shape) -> _Shape:
    """A shape that bounds both: an unknown part bounds like _UNKNOWN, never hides a known larger one."""
    if a is b:
        return a
    item = None if a.item is None and b.item is None else _join(_item(a), _item(b))
    return _Shape(max(a.size, b.size), max(a.count, b.count), item)


def _chars(size: int) -> int:
    """Kubernetes charges 0.1 per character a string operation traverses."""
    return (size + 9) // 10


def _bare_identifier(node: Any) -> str | None:
    """The name when `node` is a plain identifier (a macro's or cel.bind's variable), else None."""
    while isinstance(node, Tree) and len(node.children) == 1 and node.data in _WRAPPERS:
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _is_bind(tree: Tree[Any]) -> bool:
    return len(tree.children) == 3 and tree.children[1] == "bind" and _bare_identifier(tree.children[0]) == "cel"


class _Estimator:
    """Worst-case cost of an expression in syntax-tree nodes visited, Kubernetes-style: comprehensions
    multiply their body by the size of what they iterate, string and list operations add 0.1 per element
    they traverse, and a variable (comprehension or cel.bind) carries the shape of its value, so doubling a
    string through nested binds is estimated as exponential, as it is. Recursion is bounded: a subtree
    deeper than MAX_TREE_DEPTH is refused before its children are visited."""

    def __init__(self) -> None:
        self.variables: dict[str, _Shape] = {}

    def estimate(self, node: Any, depth: int = 1) -> tuple[int, _Shape]:
        cost = 0
        while isinstance(node, Tree) and len(node.children) == 1 and node.data in _WRAPPERS:
            cost += 1
            depth += 1
            node = node.children[0]
        if depth > MAX_TREE_DEPTH:
            raise SelectorError(_too_deep(f"its syntax tree is over {MAX_TREE_DEPTH} levels deep"))
        if not isinstance(node, Tree):
            return cost + 1, _SCALAR
        handler = getattr(self, f"_{node.data}", None)
        own, shape = handler(node, depth) if handler is not None else self._generic(node, depth)
        return min(cost + own, _CAP), shape

    def _sum(self, nodes: list[Any], depth: int) -> tuple[int, list[_Shape]]:
        total, shapes = 0, []
        for child in nodes:
            cost, shape = self.estimate(child, depth + 1)
            total += cost
            shapes.append(shape)
        return total, shapes

    def _generic(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        """Anything else (a message literal): its value may hold all its parts."""
        cost, shapes = self._sum(node.children, depth)
        size = sum(s.size for s in shapes)
        return 1 + cost, _shape(max(size, _UNKNOWN_LENGTH), max([_UNKNOWN_SIZE, *(s.count for s in shapes)]), None)

    def _literal(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        text = str(node.children[0])
        return 2, _Shape(len(text), 0) if text[-1:] in "\"'" else _SCALAR

    def _ident(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        name = str(node.children[0])
        found = self.variables.get(name)
        return 2, found if found is not None else _UNKNOWN if name == "device" else _SCALAR

    def _dot_ident(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        return 2, _UNKNOWN

    def _list_lit(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        return self._collection(node, depth, 1)

    def _map_lit(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        return self._collection(node, depth, 2)  # keys and values alternate

    def _collection(self, node: Tree[Any], depth: int, per_element: int) -> tuple[int, _Shape]:
        """A list or map literal: its parts' cost, and as many elements as it lists (each part's shape
        joined into one for what a comprehension over it may visit)."""
        if not node.children:
            return 1, _EMPTY
        parts = node.children[0].children
        cost, shapes = self._sum(parts, depth + 1)
        item = shapes[0]
        for shape in shapes[1:]:
            item = _join(item, shape)
        return 2 + cost, _shape(len(parts) + sum(s.size for s in shapes), len(parts) // per_element, item)

    def _expr(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:  # c ? a : b
        cost, shapes = self._sum(node.children, depth)
        return 1 + cost, _join(shapes[1], shapes[-1])

    def _conditionalor(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        cost, _ = self._sum(node.children, depth)
        return 1 + cost, _SCALAR

    _conditionaland = _conditionalor
    _multiplication = _conditionalor
    _unary = _conditionalor

    def _relation(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        operator, right_node = node.children
        left_cost, left = self.estimate(operator.children[0], depth + 2)
        right_cost, right = self.estimate(right_node, depth + 1)
        if operator.data == "relation_in":
            compare = right.count + _chars(right.size)
        else:
            compare = _chars(min(left.size, right.size))
        return 2 + left_cost + right_cost + compare, _SCALAR

    def _addition(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        operator, right_node = node.children
        left_cost, left = self.estimate(operator.children[0], depth + 2)
        right_cost, right = self.estimate(right_node, depth + 1)
        cost = 2 + left_cost + right_cost
        if operator.data != "addition_add":
            return cost, _SCALAR
        size = left.size + right.size
        item = None if left.item is None and right.item is None else _join(_item(left), _item(right))
        return cost + _chars(size), _shape(size, left.count + right.count, item)

    def _member_dot(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        cost, shape = self.estimate(node.children[0], depth + 1)
        return 2 + cost, _item(shape)

    def _member_index(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        cost, shapes = self._sum(node.children, depth)
        return 1 + cost, _item(shapes[0])

    def _member_dot_arg(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        target, name = node.children[0], str(node.children[1])
        arguments = node.children[2].children if len(node.children) == 3 else []
        if name == "bind" and _bare_identifier(target) == "cel":
            return self._bind(arguments, depth + 2)
        if name == "reduce":
            raise SelectorError("CEL compile error: reduce() is not part of Kubernetes CEL")
        if name in _MACROS and len(arguments) >= 2:
            return self._comprehension(name, target, arguments, depth)
        target_cost, receiver = self.estimate(target, depth + 1)
        cost, shapes = self._sum(arguments, depth + 1)
        size = receiver.size + sum(s.size for s in shapes)
        cost += 2 + target_cost + _chars(size)
        if name == "min":
            return cost + receiver.count, _item(receiver)
        return cost, _SCALAR if name in _SCALAR_METHODS else _shape(size, 0, None)

    def _comprehension(self, name: str, target: Any, arguments: list[Any], depth: int) -> tuple[int, _Shape]:
        variable = _bare_identifier(arguments[0])
        if variable is None:
            raise SelectorError(f"CEL compile error: the first argument of {name}() must be a variable name")
        target_cost, iterated = self.estimate(target, depth + 1)
        saved = self.variables.get(variable)
        self.variables[variable] = _item(iterated)
        try:
            body_cost, shapes = self._sum(arguments[1:], depth + 2)
        finally:
            self._restore(variable, saved)
        visits = iterated.count
        cost = 2 + target_cost + visits * (1 + body_cost)
        if name == "map":
            body = shapes[-1]
            return cost, _shape(visits * (1 + body.size), visits, body)
        return cost, iterated if name == "filter" else _SCALAR

    def _bind(self, arguments: list[Any], depth: int) -> tuple[int, _Shape]:
        variable = _bare_identifier(arguments[0]) if len(arguments) == 3 else None
        if variable is None:
            raise SelectorError("CEL compile error: cel.bind takes a variable name, a value and an expression")
        init_cost, value = self.estimate(arguments[1], depth + 1)
        saved = self.variables.get(variable)
        self.variables[variable] = value
        try:
            body_cost, body = self.estimate(arguments[2], depth + 1)
        finally:
            self._restore(variable, saved)
        return 3 + init_cost + body_cost, body

    def _ident_arg(self, node: Tree[Any], depth: int) -> tuple[int, _Shape]:
        name = str(node.children[0])
        arguments = node.children[1].children if len(node.children) == 2 else []
        cost, shapes = self._sum(arguments, depth + 1)
        if name == "has" or not shapes:
            return 2 + cost, _SCALAR
        size = sum(s.size for s in shapes)
        return 2 + cost + _chars(size), shapes[0] if name in _SIZED_FUNCTIONS else _SCALAR

    _dot_ident_arg = _ident_arg

    def _restore(self, variable: str, saved: _Shape | None) -> None:
        if saved is None:
            del self.variables[variable]
        else:
            self.variables[variable] = saved


def estimate_cost(node: Any) -> int:
    """Worst-case cost of a parsed expression (see _Estimator); raises SelectorError for a tree deeper
    than MAX_TREE_DEPTH or a construct Kubernetes does not have."""
    return _Estimator().estimate(node)[0]


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
        self.checkpoint = min(limit, _CHECK_TIME_EVERY)

    def check(self) -> None:
        if self.steps > self.limit:
            raise _Stopped("steps")
        if time.thread_time() - (_gc_seconds - self.gc_before) > self.deadline:
            raise _Stopped("time")
        self.checkpoint = min(self.limit, self.steps + _CHECK_TIME_EVERY)


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
        if not _is_bind(tree):
            return super().member_dot_arg(tree)
        variable, init, body = tree.children[2].children
        try:
            value = self.visit(init)
        except CELEvalError as error:
            value = error
        nested = self.sub_evaluator(body)
        nested.set_activation({str(_bare_identifier(variable)): value})
        return nested.visit(body)


class _Runner(celpy.InterpretedRunner):
    def evaluate(self, activation: Context, meter: _Meter | None = None) -> ct.Value:
        if meter is None:
            meter = _Meter(MAX_STEPS_PER_EVALUATION, EVALUATION_TIME_LIMIT_S)
        return _Evaluator(self.ast, self.new_activation(), meter).evaluate(activation)


_ENV = celpy.Environment(runner_class=_Runner)


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


@dataclass(frozen=True)
class _Refusal:
    """Why a text is not a selector, as SelectorError says it (kept in the compile cache)."""

    message: str
    pointed: str | None = None


# Compiled selectors kept, most recently used last. A compiled program takes about 25 KB, so the cache is
# bounded by count and nothing else holds a program for long: a queue of claims with thousands of distinct
# selectors costs recompiling (charged to those claims' meters), never memory without bound.
COMPILE_CACHE_SIZE = 1024
_compiled: OrderedDict[str, CompiledSelector | _Refusal] = OrderedDict()


def compile_selector(expression: str, meter: Meter | None = None) -> CompiledSelector:
    """Compile once per text (while it stays cached); any problem raises SelectorError with a message for
    the claim's author. A compilation (not a cache hit) is charged to `meter`, before the work."""
    if not isinstance(expression, str):
        raise SelectorError(f"CEL expression must be a string, got {type(expression).__name__}")
    found = _compiled.get(expression)
    if found is None:
        if meter is not None:
            meter.spend_whole(COMPILE)
        found = _compile(expression)
        _compiled[expression] = found
        if len(_compiled) > COMPILE_CACHE_SIZE:
            _compiled.popitem(last=False)
    else:
        _compiled.move_to_end(expression)
    if isinstance(found, _Refusal):
        raise SelectorError(found.message, found.pointed)  # a new one each time: no traceback piles up
    return found


@dataclass(frozen=True)
class SelectorText:
    """A selector as a plan keeps it: its text and the device fields it reads (found in the text, without
    parsing). It is compiled only when the memo lacks a device's result, so indexes built again from
    results already known cost no compilation."""

    expression: str
    names: frozenset[str] | None  # as CompiledSelector.names

    def compiled(self, meter: Meter | None = None) -> CompiledSelector:
        return compile_selector(self.expression, meter)


def selector_text(expression: str) -> SelectorText:
    return SelectorText(expression, _names_read(expression))


# A quoted string with backslash escapes, as CEL writes them. Raw and triple-quoted strings are left alone
# (their words then count as identifiers: a signature finer than needed, never a wrong one).
_QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"' + "|" + r"'(?:[^'\\\n]|\\.)*'")
_RAW_OR_TRIPLE = re.compile(r"[rR][\"']|\"\"\"|'''")
_INDEXING = re.compile(r"\[\s*\??\s*$")  # what precedes a string used as a map key: `["numa-node"]`, `[?"x"]`
_NAMES: dict[frozenset[str], frozenset[str]] = {}


def _names_read(expression: str) -> frozenset[str] | None:
    """The identifiers an expression reads; None when it iterates and so may read any attribute. The words
    of a string literal count only where the string indexes a map (`attributes["gpu.nvidia.com"]["x"]`):
    the values it compares are not names, so selectors that differ only in those read the same names and
    share one frozen set and the memo's signatures (a claim may hold 256 selectors alike but for a value)."""
    if _ITERATES.search(expression):
        return None
    text = expression
    if not _RAW_OR_TRIPLE.search(expression):
        text = _QUOTED.sub(lambda m: m.group(0) if _INDEXING.search(expression, 0, m.start()) else "''", expression)
    names = frozenset(_IDENTIFIER.findall(text))
    if len(_NAMES) > 4096:
        _NAMES.clear()
    return _NAMES.setdefault(names, names)


def is_compiled(expression: str) -> bool:
    """Whether compiling `expression` now would cost nothing (for tests and benchmarks)."""
    return expression in _compiled


def _compile(expression: str) -> CompiledSelector | _Refusal:
    """The selector, or why it is refused: refusals are cached too (parsing 10 KiB can take 0.4 s)."""
    size = len(expression.encode("utf-8", "surrogatepass"))
    if size > MAX_CEL_LENGTH:
        return _Refusal(f"CEL expression is {size} bytes, over the limit of {MAX_CEL_LENGTH}")
    nesting = _bracket_nesting(expression)
    if nesting > MAX_NESTING:
        return _Refusal(_too_deep(f"{nesting} nested brackets, over the limit of {MAX_NESTING}"))
    rewritten = expression
    try:
        rewritten = rewrite(expression)  # raises ValueError on unbalanced brackets of a `.?` form
        ast = _ENV.compile(rewritten)
        cost = estimate_cost(ast)
        if cost > MAX_COST:
            return _Refusal(f"CEL expression is too complex: estimated cost {cost:,} exceeds the limit of "
                            f"{MAX_COST:,}; iterate over fewer elements, nest fewer comprehensions or build smaller "
                            "strings")
        program = _ENV.program(ast, functions=FUNCTIONS)
    except SelectorError as error:
        return _Refusal(str(error))
    except celpy.CELParseError as error:
        return _syntax_error(expression, rewritten, error)
    except RecursionError:  # raised, not returned: the caller's stack may be to blame, do not cache it
        raise SelectorError(_too_deep("it ran out of stack while being compiled")) from None
    except MemoryError:
        raise
    except ValueError as error:
        return _Refusal(f"CEL compile error: {error}")
    except Exception as error:  # noqa: BLE001 - a claim's text must never crash the allocator
        return _Refusal(f"CEL compile error: {type(error).__name__}: {error}")
    return CompiledSelector(expression, program, _names_read(expression))


# What the parser expected, in CEL's own words (lark's terminal names otherwise)
_TERMINALS = {"RPAR": "')'", "RSQB": "']'", "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "DOT": "'.'",
              "IDENT": "a name", "QMARK": "'?'", "LPAR": "'('", "LSQB": "'['", "LBRACE": "'{'"}
_OPERAND = frozenset({"IDENT", "INT_LIT", "STRING_LIT"})  # one of these expected: an operand is missing
SHOWN_EXPRESSION = 300  # characters of an expression a one-line message quotes whole; past it, the part around


def _syntax_error(expression: str, rewritten: str, error: celpy.CELParseError) -> _Refusal:
    """cel-python's parse error (lark's excerpt of the text, often cut at a line or a token) named, with
    its line and column in the claim's own text, the whole expression quoted (one line) and, for
    `pointed`, the expression again with a caret under the position."""
    cause = error.__context__
    token = getattr(cause, "token", None)
    expected = set(getattr(cause, "expected", None) or getattr(cause, "allowed", None) or ())
    char = getattr(cause, "char", None)
    at: int | None = getattr(cause, "pos_in_stream", None)
    if token is not None and getattr(token, "type", "") == "$END":
        what, at = "the expression ends too early", len(rewritten.rstrip())
    elif token is not None:
        what = f"unexpected {str(token)!r}"
        if at is None:  # a token lark made itself (true, false, null) has no position: it follows the last one
            before = (getattr(cause, "token_history", None) or [None])[-1]
            after = getattr(before, "end_pos", None)
            at = rewritten.find(str(token), after) if after is not None else -1
            at = at if at >= 0 else None
    elif char in ("'", '"'):
        what, expected = "a string that is never closed", set()
    elif char is not None:
        what = f"unexpected character {char!r}"
    else:
        what = " ".join(str(error.args[0]).split()) if error.args else "invalid syntax"
    if expected & _OPERAND:
        what += ": a value is missing"
    elif expected and expected <= set(_TERMINALS):
        what += f": expected {' or '.join(sorted(_TERMINALS[e] for e in expected))}"
    elif token is not None and expected:
        what += ": an operator is missing"
    where = _in_original(expression, rewritten, at)
    if where is None:
        return _Refusal(f"CEL compile error: syntax error: {what}, in: {_one_line(expression)}")
    line = expression.count("\n", 0, where) + 1
    column = where - (expression.rfind("\n", 0, where) + 1) + 1
    head = f"CEL compile error: syntax error at line {line}, column {column}: {what}"
    message = f"{head}, in: {_one_line(expression, where)}"
    lines = expression.split("\n")
    pointed = "\n".join([head,
                         *(f"  {text}" for text in lines[:line]), "  " + " " * (column - 1) + "^",
                         *(f"  {text}" for text in lines[line:])])
    return _Refusal(message, pointed)


def _in_original(expression: str, rewritten: str, at: int | None) -> int | None:
    """`at` in `rewritten` as a position in `expression`: the rewrite of `.?` forms changes the text in
    places, so a position before the first change or after the last one is known, one between is not."""
    if at is None or rewritten == expression:
        return at
    prefix = next((i for i, (a, b) in enumerate(zip(expression, rewritten, strict=False)) if a != b),
                  min(len(expression), len(rewritten)))
    if at < prefix:
        return at
    suffix = next((i for i, (a, b) in enumerate(zip(reversed(expression), reversed(rewritten), strict=False))
                   if a != b), min(len(expression), len(rewritten)))
    shift = len(rewritten) - len(expression)
    return at - shift if at >= len(rewritten) - suffix and 0 <= at - shift <= len(expression) else None


def _one_line(expression: str, at: int | None = None) -> str:
    """The expression on one line (its line breaks as spaces), whole up to SHOWN_EXPRESSION characters,
    else the part around `at` (or its start)."""
    text = " ".join(expression.split("\n"))
    if len(text) <= SHOWN_EXPRESSION:
        return text
    start = max(0, min((at or 0) - SHOWN_EXPRESSION // 2, len(text) - SHOWN_EXPRESSION))
    return (("..." if start else "") + text[start:start + SHOWN_EXPRESSION]
            + ("..." if start + SHOWN_EXPRESSION < len(text) else ""))


def to_cel_value(value: Any) -> Any:
    if isinstance(value, bool):
        return ct.BoolType(value)
    if isinstance(value, int):
        return ct.IntType(value)
    if isinstance(value, SemVer | CelQuantity):
        return value
    if isinstance(value, Quantity):
        return CelQuantity(value)
    return ct.StringType(str(value))


def device_activation(
    driver: str, attributes: Mapping[str, Mapping[str, Any]], capacity: Mapping[str, Mapping[str, Quantity]]
) -> ct.MapType:
    """The CEL `device` variable: attributes and capacity grouped by domain, as DRA builds it."""

    def grouped(source: Mapping[str, Mapping[str, Any]]) -> _DefaultingMap:
        return _DefaultingMap(
            {
                ct.StringType(domain): ct.MapType(
                    {ct.StringType(name): to_cel_value(v) for name, v in values.items()}
                )
                for domain, values in source.items()
            }
        )

    return ct.MapType(
        {
            ct.StringType("driver"): ct.StringType(driver),
            ct.StringType("attributes"): grouped(attributes),
            ct.StringType("capacity"): grouped(capacity),
        }
    )


_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_RULE = re.compile(r"Token\('RULE', '(\w+)'\)")
_CEL_NAMES = {
    "relation_eq": "_==_", "relation_ne": "_!=_", "relation_lt": "_<_", "relation_le": "_<=_",
    "relation_gt": "_>_", "relation_ge": "_>=_", "relation_in": "_in_", "addition_add": "_+_",
    "addition_sub": "_-_", "multiplication_mul": "_*_", "multiplication_div": "_/_",
    "multiplication_mod": "_%_", "unary_not": "!_", "unary_neg": "-_",
    "StringType": "string", "IntType": "int", "UintType": "uint", "DoubleType": "double", "BoolType": "bool",
    "BytesType": "bytes", "ListType": "list", "MapType": "map", "NoneType": "null", "CelQuantity": "Quantity",
    "SemVer": "Semver", "TimestampType": "timestamp", "DurationType": "duration", "_DefaultingMap": "map",
}
_VAGUE = frozenset({"return error for overflow", "no such overload", "invalid_argument", "match error"})


def _readable(text: str) -> str:
    """cel-python's messages with CEL's names for operators and types, and without the activation dump
    ("undeclared reference to 'x' (in activation ...)" carries the whole device)."""
    text = text.split(" (in activation", 1)[0]
    text = _RULE.sub(lambda m: _CEL_NAMES.get(m[1], m[1]), text)
    return _CLASS.sub(lambda m: _CEL_NAMES.get(m[1], m[1]), text)


def _runtime_error(error: CELEvalError) -> str:
    """CEL's message; where it is vague ("return error for overflow" for an invalid quantity), the Python
    error behind it; Kubernetes' hint where a missing key is the cause."""
    message = _readable(str(error.args[0]) if error.args else str(error))
    cause = error.args[2] if len(error.args) > 2 else ()
    detail = _readable(str(cause[0]))[:300] if isinstance(cause, tuple) and cause else ""
    if message == "no such key" and detail:
        message = f"no such key: '{detail}'"
    elif message in _VAGUE and detail and detail != "overflow" and "CELEvalError" not in detail:
        message = detail if message == "return error for overflow" else f"{message}: {detail}"
    if "no such key" in message or "no such member" in message:
        message = f"{message}; {GUARD_HINT}"
    return f"CEL runtime error: {message[:1000]}"


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
        raise SelectorError(_runtime_error(error)) from None
    except RecursionError:
        raise SelectorError(_too_deep("it ran out of stack while being evaluated")) from None
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - a claim's text must never crash the allocator
        raise SelectorError(f"CEL runtime error: {type(error).__name__}: {error}") from None
    if isinstance(result, CELEvalError):
        raise SelectorError(_runtime_error(result))
    if not isinstance(result, bool | ct.BoolType):
        raise SelectorError(f"CEL expression must evaluate to bool, got {type(result).__name__}")
    return bool(result)
