"""Device selectors in CEL, compiled the way Kubernetes DRA compiles them, once per expression text.

A selector is the claim's own text and must never crash or stall the allocator, so everything is bounded
before and while it runs, and every failure is a SelectorError (the allocator makes the claim Rejected):
- before parsing: 10 KiB of text (Kubernetes' limit) and at most MAX_NESTING nested brackets;
- after parsing: a syntax tree at most MAX_TREE_DEPTH deep and an estimated worst-case cost of at most
  MAX_COST (shared.dra.cel_cost);
- while running: a step limit and a CPU-time limit per evaluation and a step budget per selector
  (shared.dra.cel_runtime).

Compiled programs and refusals are cached (a bounded cache). A selector's result depends only on the device
fields its expression names (`SelectorText.names`), so the selector memo (shared.dra.matching) keeps results
per distinct tuple of those values: a fleet of 1,000 identical H100s costs one evaluation, not 1,000
(cel-python needs 0.25-0.8 ms each).

The names other modules use (SelectorError, SemVer, device_activation, evaluate, ...) are importable from here.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

import celpy

from shared.dra.budget import COMPILE, Meter
from shared.dra.cel_cost import MAX_COST, MAX_NESTING, bracket_nesting, estimate_cost
from shared.dra.cel_errors import Refusal, SelectorError, syntax_error, too_deep
from shared.dra.cel_library import FUNCTIONS, SemVer, device_activation
from shared.dra.cel_rewrite import rewrite
from shared.dra.cel_runtime import ENVIRONMENT, CompiledSelector, EvaluationBudget, evaluate
from shared.dra.v1 import MAX_CEL_LENGTH

__all__ = ["CompiledSelector", "EvaluationBudget", "SelectorError", "SelectorText", "SemVer",
           "compile_selector", "device_activation", "evaluate", "is_compiled", "selector_text"]

# Compiled selectors kept, most recently used last. A compiled program takes about 25 KB, so the cache is
# bounded by count and nothing else holds a program for long: a queue of claims with thousands of distinct
# selectors costs recompiling (charged to those claims' meters), never memory without bound.
COMPILE_CACHE_SIZE = 1024
_compiled: OrderedDict[str, CompiledSelector | Refusal] = OrderedDict()


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
    if isinstance(found, Refusal):
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


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# Expressions that iterate over maps can read any attribute: they get the whole device as their key.
_ITERATES = re.compile(r"\.(exists|exists_one|all|map|filter)\s*\(|\bin\s+device\b|\bsize\s*\(")
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


def _compile(expression: str) -> CompiledSelector | Refusal:
    """The selector, or why it is refused: refusals are cached too (parsing 10 KiB can take 0.4 s)."""
    size = len(expression.encode("utf-8", "surrogatepass"))
    if size > MAX_CEL_LENGTH:
        return Refusal(f"CEL expression is {size} bytes, over the limit of {MAX_CEL_LENGTH}")
    nesting = bracket_nesting(expression)
    if nesting > MAX_NESTING:
        return Refusal(too_deep(f"{nesting} nested brackets, over the limit of {MAX_NESTING}"))
    rewritten = expression
    try:
        rewritten = rewrite(expression)  # raises ValueError on unbalanced brackets of a `.?` form
        ast = ENVIRONMENT.compile(rewritten)
        cost = estimate_cost(ast)
        if cost > MAX_COST:
            return Refusal(f"CEL expression is too complex: estimated cost {cost:,} exceeds the limit of "
                           f"{MAX_COST:,}; iterate over fewer elements, nest fewer comprehensions or build smaller "
                           "strings")
        program = ENVIRONMENT.program(ast, functions=FUNCTIONS)
    except SelectorError as error:
        return Refusal(str(error))
    except celpy.CELParseError as error:
        return syntax_error(expression, rewritten, error)
    except RecursionError:  # raised, not returned: the caller's stack may be to blame, do not cache it
        raise SelectorError(too_deep("it ran out of stack while being compiled")) from None
    except MemoryError:
        raise
    except ValueError as error:
        return Refusal(f"CEL compile error: {error}")
    except Exception as error:  # a claim's text must never crash the allocator
        return Refusal(f"CEL compile error: {type(error).__name__}: {error}")
    return CompiledSelector(expression, program, _names_read(expression))
