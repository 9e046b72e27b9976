"""How a selector's failures are told to its author: one line for a status, the expression with a caret
under the error for a terminal, and cel-python's messages in CEL's own names."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

import celpy
from celpy.evaluation import CELEvalError

TYPO_CUTOFF = 0.8  # how alike a missing name and an existing one must be to name the latter (difflib's ratio)
_QUOTED = re.compile(r"'([^']+)'")
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


@dataclass(frozen=True)
class Refusal:
    """Why a text is not a selector, as SelectorError says it (kept in the compile cache)."""

    message: str
    pointed: str | None = None


def too_deep(what: str) -> str:
    return (f"CEL expression nested too deeply: {what}; each pair of brackets adds about 10 levels, each "
            "chained operator (&&, ||, +) one: flatten it or split it into several selectors")


# What the parser expected, in CEL's own words (lark's terminal names otherwise)
_TERMINALS = {"RPAR": "')'", "RSQB": "']'", "RBRACE": "'}'", "COMMA": "','", "COLON": "':'", "DOT": "'.'",
              "IDENT": "a name", "QMARK": "'?'", "LPAR": "'('", "LSQB": "'['", "LBRACE": "'{'"}
_OPERAND = frozenset({"IDENT", "INT_LIT", "STRING_LIT"})  # one of these expected: an operand is missing
SHOWN_EXPRESSION = 300  # characters of an expression a one-line message quotes whole; past it, the part around


def syntax_error(expression: str, rewritten: str, error: celpy.CELParseError) -> Refusal:
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
        return Refusal(f"CEL compile error: syntax error: {what}, in: {_one_line(expression)}")
    line = expression.count("\n", 0, where) + 1
    column = where - (expression.rfind("\n", 0, where) + 1) + 1
    head = f"CEL compile error: syntax error at line {line}, column {column}: {what}"
    message = f"{head}, in: {_one_line(expression, where)}"
    lines = expression.split("\n")
    pointed = "\n".join([head,
                         *(f"  {text}" for text in lines[:line]), "  " + " " * (column - 1) + "^",
                         *(f"  {text}" for text in lines[line:])])
    return Refusal(message, pointed)


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


def runtime_error(error: CELEvalError, names: Iterable[str] = ()) -> str:
    """CEL's message; where it is vague ("return error for overflow" for an invalid quantity), the Python
    error behind it; Kubernetes' hint where a missing key is the cause, after the closest of `names` (the
    device's attribute and capacity names) where the missing one looks like a typo of it."""
    message = _readable(str(error.args[0]) if error.args else str(error))
    cause = error.args[2] if len(error.args) > 2 else ()
    detail = _readable(str(cause[0]))[:300] if isinstance(cause, tuple) and cause else ""
    if message == "no such key" and detail:
        message = f"no such key: '{detail}'"
    elif message in _VAGUE and detail and detail != "overflow" and "CELEvalError" not in detail:
        message = detail if message == "return error for overflow" else f"{message}: {detail}"
    if "no such key" in message or "no such member" in message:
        missing = _QUOTED.search(message)
        close = difflib.get_close_matches(missing[1], sorted(set(names) - {missing[1]}), 1, TYPO_CUTOFF) \
            if missing else []
        typo = f" (did you mean '{close[0]}'?)" if close else ""
        message = f"{message}{typo}; {GUARD_HINT}"
    return f"CEL runtime error: {message[:1000]}"
