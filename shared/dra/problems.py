"""A user's document and its problems told to a person: which strings the ledger cannot store and what
is nested too deeply (`text_problems`), a value quoted for a message (`shown`), pydantic's errors as
Kubernetes field paths (`validation_problems`), and a bounded list of problems as one reason (`joined`)."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

MAX_DEPTH = 240  # nesting of a whole claim: deeper, it could not be written back out as JSON (pydantic: ~250)
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # what text_problem refuses, in one search
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # JSON allows any integer; Kubernetes' fields stop at int64


def shown(value: object, limit: int = 64) -> str:
    """A user's value quoted for a message: control characters and lone surrogates escaped (the message
    lands in the ledger, where PostgreSQL refuses NUL), long values cut short."""
    try:
        text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, int) else repr(value)
    except ValueError:  # an integer of more than 4,300 digits
        text = "<a number too long to show>"
    cut = text if len(text) <= limit else text[:limit] + "..."
    escaped = "".join(c if c.isprintable() and c not in '"\\' else json.dumps(c)[1:-1] for c in cut)
    return f'"{escaped}"'


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored: PostgreSQL refuses NUL in text, and a lone surrogate has no UTF-8."""
    if "\x00" in value:
        return "must not contain NUL characters"
    if _SURROGATE.search(value):
        return "must not contain unpaired surrogates (not valid Unicode)"
    return None


def _clean(document: Any) -> bool:
    """Whether a document has no string `text_problem` refuses and nothing nested deeper than MAX_DEPTH:
    the common case, checked without building a field path per node (that costs a tenth of a burst)."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return False
        elif isinstance(item, int) and not _INT64_MIN <= item <= _INT64_MAX:
            return False
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return False
            if isinstance(item, dict):
                for key, value in item.items():
                    if isinstance(key, str) and _UNSTORABLE.search(key):
                        return False
                    stack.append((value, depth + 1))
            else:
                stack.extend((value, depth + 1) for value in item)
    return True


def text_problems(document: Any, path: str = "") -> list[str]:
    """Every string (key or value) of a parsed document that `text_problem` refuses, and any part nested
    deeper than MAX_DEPTH, by field path. Iterative, so a deeply nested document cannot exhaust the stack."""
    if _clean(document):
        return []
    problems = []
    stack: list[tuple[str, Any, int]] = [(path, document, 0)]
    while stack:
        where, item, depth = stack.pop()
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                problems.append(f"{where or '<document>'}: {problem}")
        elif isinstance(item, int) and not _INT64_MIN <= item <= _INT64_MAX:
            problems.append(f"{where or '<document>'}: {shown(str(item))} is outside the 64-bit integer range "
                            "(Kubernetes' int64)")
        elif isinstance(item, dict | list | tuple) and depth >= MAX_DEPTH:
            cut = re.sub(r"(\[[0-9]+\])+$", "", where)  # name the field, not a chain of [0][0]...
            cut = cut if len(cut) <= 120 else cut[:120] + "..."
            problems.append(f"{cut}: nested more than {MAX_DEPTH} levels deep")
        elif isinstance(item, dict):
            for key, value in reversed(item.items()):
                if isinstance(key, str) and (problem := text_problem(key)) is not None:
                    problems.append(f"{where or '<document>'}: key {shown(key)} {problem}")
                    continue
                stack.append((_child(where, key), value, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", value, depth + 1) for i, value in reversed(list(enumerate(item))))
    return problems


def _child(where: str, key: object) -> str:
    """`a.b` for a field name, `a[key]` for a map key that is not a plain name (annotation keys)."""
    text = key if isinstance(key, str) else str(key)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and not where.endswith((".annotations", ".labels")):
        return f"{where}.{text}" if where else text
    return f"{where}[{shown(text)[1:-1]}]"


class DocumentError(ValueError):
    """A document that is not a valid object; the message names the field."""


MAX_PROBLEMS_SHOWN = 10  # a reason is read by a person; the first ten problems say enough


def _location(loc: tuple[int | str, ...]) -> str:
    """pydantic's loc as a Kubernetes field path: `spec.devices.requests[1].name`, map keys in brackets
    (`metadata.annotations[claimbroker.io/priority]`)."""
    out = ""
    previous: list[int | str] = []
    for part in loc:
        if part == "function-after":
            continue
        in_map = bool(previous) and (
            previous[-1] in ("labels", "annotations", "attributes", "counters")
            or (previous[-1] == "capacity" and part != "requests")
            or previous[-2:] == ["capacity", "requests"])
        if isinstance(part, int):
            out += f"[{part}]"
        elif in_map or part.startswith("["):
            out += f"[{shown(part)[1:-1]}]" if not part.startswith("[") else part
        else:
            out += f".{shown(part)[1:-1]}" if out else shown(part)[1:-1]
        previous.append(part)
    return out


def describe_validation_error(error: ValidationError) -> str:
    """One problem per clause, each naming the camelCase field path, as kubectl does."""
    return joined(validation_problems(error))


def validation_problems(error: ValidationError, within: tuple[str, ...] = ()) -> list[str]:
    """pydantic's errors as `path: problem` lines; `within` is the path of what was validated."""
    parts = []
    for item in error.errors():
        path = _location((*within, *item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "missing":
            message = "is required"
        elif item["type"] == "extra_forbidden":
            message = "unknown field (the API server's strict field validation, kubectl's default, refuses it)"
        parts.append(f"{path}: {message}" if path else message)
    return parts


def joined(problems: list[str]) -> str:
    """At most MAX_PROBLEMS_SHOWN problems of at most 1,000 characters each: the reason is stored and
    published (a NATS message is at most 1 MiB), and a long path deep in a document says no more."""
    more = len(problems) - MAX_PROBLEMS_SHOWN
    shown_problems = [p if len(p) <= 1000 else p[:1000] + "..." for p in problems[:MAX_PROBLEMS_SHOWN]]
    return "; ".join(shown_problems) + (f"; and {more} more" if more > 0 else "")
