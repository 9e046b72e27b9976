"""Kubernetes CEL syntax that cel-python's grammar lacks, rewritten into what it has, before compiling.

- `X.?f.orValue(d)` becomes `(has(X.f) ? X.f : d)` and `X.?f.hasValue()` becomes `has(X.f)`, for X a
  `device.attributes[...]` or `device.capacity[...]` lookup: the optional-chaining idiom DRA documents.
  X is a fixed-form lookup, so the text grows by a bounded amount per use, never exponentially.

`cel.bind(v, init, body)` parses as it is and is evaluated natively by shared.dra.cel_runtime (v holds the
value of init, evaluated once): substituting init's text for v would grow the text exponentially with nested
binds.
"""

from __future__ import annotations

import re

_LOOKUP = r"device\.(?:attributes|capacity)\[\s*(?:\"[^\"]*\"|'[^']*')\s*\]"
_OR_VALUE = re.compile(rf"({_LOOKUP})\.\?([A-Za-z_]\w*)\.orValue\(")
_HAS_VALUE = re.compile(rf"({_LOOKUP})\.\?([A-Za-z_]\w*)\.hasValue\(\s*\)")


def _split_call(text: str, start: int) -> tuple[list[str], int]:
    """Arguments of the call whose '(' is at text[start-1]; returns them and the index after ')'."""
    depth, args, current, i, quote = 0, [], [], start, ""
    while i < len(text):
        ch = text[i]
        if quote:
            current.append(ch)
            if ch == "\\" and i + 1 < len(text):
                current.append(text[i + 1])
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
            current.append(ch)
        elif ch in "([{":
            depth += 1
            current.append(ch)
        elif ch in ")]}":
            if depth == 0:
                args.append("".join(current).strip())
                return args, i + 1
            depth -= 1
            current.append(ch)
        elif ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    raise ValueError("unbalanced parentheses")


def rewrite(expression: str) -> str:
    text = _HAS_VALUE.sub(r"has(\1.\2)", expression)
    position = 0
    while match := _OR_VALUE.search(text, position):
        [default], end = _split_call(text, match.end())
        lookup, field = match.group(1), match.group(2)
        text = text[: match.start()] + f"(has({lookup}.{field}) ? {lookup}.{field} : {default})" + text[end:]
        position = match.start()  # the default may hold another `.?`: search on from here, not from 0
    return text
