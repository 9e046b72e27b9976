"""Kubernetes CEL syntax that cel-python's grammar lacks, rewritten into what it has, before compiling.

- `X.?f.orValue(d)` becomes `(has(X.f) ? X.f : d)` and `X.?f.hasValue()` becomes `has(X.f)`, for X a
  `device.attributes[...]` or `device.capacity[...]` lookup: the optional-chaining idiom DRA documents.
- `cel.bind(v, init, body)` becomes body with `v` replaced by `(init)`: same value, no new scope rules.
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


def _replace_identifier(body: str, name: str, value: str) -> str:
    out, i, quote = [], 0, ""
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
    while i < len(body):
        ch = body[i]
        if quote:
            out.append(ch)
            if ch == quote:
                quote = ""
            i += 1
            continue
        if ch in "\"'":
            quote = ch
            out.append(ch)
            i += 1
            continue
        match = pattern.match(body, i)
        if match:
            out.append(f"({value})")
            i = match.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def rewrite(expression: str) -> str:
    text = expression
    while (index := text.find("cel.bind(")) != -1:
        args, end = _split_call(text, index + len("cel.bind("))
        if len(args) != 3 or not re.fullmatch(r"[A-Za-z_]\w*", args[0]):
            raise ValueError("cel.bind takes a variable name, a value and an expression")
        text = text[:index] + "(" + _replace_identifier(args[2], args[0], args[1]) + ")" + text[end:]
    text = _HAS_VALUE.sub(r"has(\1.\2)", text)
    while match := _OR_VALUE.search(text):
        [default], end = _split_call(text, match.end())
        lookup, field = match.group(1), match.group(2)
        text = text[: match.start()] + f"(has({lookup}.{field}) ? {lookup}.{field} : {default})" + text[end:]
    return text
