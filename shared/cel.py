"""Device selectors in CEL, evaluated the way Kubernetes DRA evaluates them.

Programs are compiled once per expression text and cached. A selector's result depends only on the
device fields its expression names, so results are memoised per distinct tuple of those values:
a fleet of 1,000 identical H100s costs one evaluation, not 1,000 (cel-python needs 0.25-0.8 ms each).
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import celpy
import celpy.celtypes as ct
from celpy.evaluation import CELEvalError
from lark import Token, Tree

from shared.cel_rewrite import rewrite
from shared.quantity import Quantity

GUARD_HINT = (
    "consider using CEL optional chaining (.? followed by orValue()) or guarding the check with has() "
    "for optional fields"
)


class SelectorError(ValueError):
    """A selector that cannot be evaluated: the claim or class is wrong, not the fleet."""


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


def _quantity(text: Any) -> CelQuantity:
    return CelQuantity(Quantity(str(text)))


def _is_quantity(text: Any) -> ct.BoolType:
    try:
        Quantity(str(text))
    except ValueError:
        return ct.BoolType(False)
    return ct.BoolType(True)


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
    "asInteger": lambda a: ct.IntType(int(a.q.value)),
    "asApproximateFloat": lambda a: ct.DoubleType(float(a.q.value)),
    "add": lambda a, b: CelQuantity(Quantity.of(a.q.value + (b.q.value if isinstance(b, CelQuantity) else b))),
    "sub": lambda a, b: CelQuantity(Quantity.of(a.q.value - (b.q.value if isinstance(b, CelQuantity) else b))),
    "major": lambda v: ct.IntType(v.major),
    "minor": lambda v: ct.IntType(v.minor),
    "patch": lambda v: ct.IntType(v.patch),
}

_ENV = celpy.Environment()
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# Expressions that iterate over maps can read any attribute: they get the whole device as their key.
_ITERATES = re.compile(r"\.(exists|exists_one|all|map|filter)\s*\(|\bin\s+device\b|\bsize\s*\(")


# Kubernetes refuses selectors whose estimated cost exceeds 1,000,000 and stops a runaway at run time.
# cel-python has neither, so: a static estimate over the parse tree (each comprehension multiplies its
# body by the size of what it iterates), and a wall-clock guard per evaluation.
MAX_COST = 1_000_000
EVALUATION_TIME_LIMIT_S = 1.0
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_UNKNOWN_SIZE = 48  # DRA's most values in one list attribute; maps of attributes hold at most 32


def _iterable_size(node: Any) -> int:
    """How many elements a comprehension over `node` may visit: a list literal's length, a map() or
    filter() result's source size, otherwise DRA's largest list."""
    while isinstance(node, Tree) and len(node.children) == 1 and node.data != "list_lit":
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "list_lit":
        items = node.children[0] if node.children else None
        return len(items.children) if isinstance(items, Tree) else 0
    if isinstance(node, Tree) and node.data == "member_dot_arg" and str(node.children[1]) in ("map", "filter"):
        return _iterable_size(node.children[0])
    return _UNKNOWN_SIZE


def estimate_cost(node: Any) -> int:
    """Tree nodes visited in the worst case; comprehensions multiply their body by the target's size."""
    if isinstance(node, Token) or not isinstance(node, Tree):
        return 1
    if node.data == "member_dot_arg" and len(node.children) == 3 and str(node.children[1]) in _MACROS:
        target, _, arguments = node.children
        body = arguments.children[-1] if isinstance(arguments, Tree) and arguments.children else arguments
        return 1 + estimate_cost(target) + _iterable_size(target) * (1 + estimate_cost(body))
    return 1 + sum(estimate_cost(child) for child in node.children)


class _Expired(BaseException):
    """BaseException, so no `except Exception` inside cel-python turns it into an evaluation error."""


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """SIGALRM interrupts a runaway evaluation; only the main thread can take signals, elsewhere the
    static cost estimate is the guard. The alarm repeats every 50 ms until the evaluation ends: a raise
    that lands where Python swallows it (a garbage-collector callback) is followed by another."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class CompiledSelector:
    expression: str
    program: Any
    names: frozenset[str] | None  # identifiers the expression reads; None means "the whole device"


@lru_cache(maxsize=4096)
def compile_selector(expression: str) -> CompiledSelector:
    """Compile once per text; a syntax error raises SelectorError with CEL's message."""
    try:
        ast = _ENV.compile(rewrite(expression))
    except ValueError as error:
        raise SelectorError(f"CEL compile error: {error}") from None
    except celpy.CELParseError as error:
        raise SelectorError(f"CEL compile error: {str(error).strip()}") from None
    cost = estimate_cost(ast)
    if cost > MAX_COST:
        raise SelectorError(f"CEL expression is too complex: estimated cost {cost:,} exceeds the limit of "
                            f"{MAX_COST:,}; iterate over fewer elements or nest fewer comprehensions")
    program = _ENV.program(ast, functions=FUNCTIONS)
    names = None if _ITERATES.search(expression) else frozenset(_IDENTIFIER.findall(expression))
    return CompiledSelector(expression, program, names)


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


def evaluate(selector: CompiledSelector, activation: ct.MapType) -> bool:
    """True or False; a runtime error or a non-bool result raises SelectorError with a hint."""
    try:
        with _time_limit(EVALUATION_TIME_LIMIT_S):
            result = selector.program.evaluate({"device": activation})
    except _Expired:
        raise SelectorError(f"CEL evaluation stopped after {EVALUATION_TIME_LIMIT_S:g}s: the expression is too "
                            "expensive to evaluate") from None
    except CELEvalError as error:
        message = error.args[0] if error.args else str(error)
        raise SelectorError(f"CEL runtime error: {message}; {GUARD_HINT}") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise SelectorError(f"CEL runtime error: {error}") from None
    if isinstance(result, CELEvalError):
        raise SelectorError(f"CEL runtime error: {result.args[0]}; {GUARD_HINT}")
    if not isinstance(result, bool | ct.BoolType):
        raise SelectorError(f"CEL expression must evaluate to bool, got {type(result).__name__}")
    return bool(result)
