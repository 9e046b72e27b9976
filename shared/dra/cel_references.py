"""Names in a CEL selector that Kubernetes' DRA compiler does not declare, found without evaluating it.

The API server type-checks a selector when a claim is created: a reference to anything but `device`, the
CEL library's functions and a macro's or cel.bind's own variables fails there ("undeclared reference to
'gpu'"), and so does a field `device` does not have. The broker evaluates selectors with cel-python, which
only notices such a name when evaluation reaches it: `... == "H100" || gpu.ready` would be allocated on
any H100 although Kubernetes refuses the claim as written.

This check reads tokens, not a syntax tree: linear in the text, so a reader can afford it for every
submission. It errs on the side of accepting: a variable bound anywhere in the expression counts as bound
everywhere, a name used as a map key or ternary branch (`x ? a : b`) is not checked, and the lists of
functions and namespaces below are a superset of what Kubernetes declares. What it reports is refused by
Kubernetes; a selector it cannot tokenize is left to the CEL compiler, which reports the syntax error.
"""

from __future__ import annotations

import re
from functools import lru_cache

# The DRA environment's one variable, and type names usable as values (`type(x) == int`).
DECLARED = frozenset({"device", "int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type",
                      "type", "dyn"})
# Functions called without a receiver, in cel-go's standard library and Kubernetes' libraries (quantity,
# semver, URLs, IP/CIDR).
GLOBAL_FUNCTIONS = frozenset({
    "has", "size", "int", "uint", "double", "string", "bytes", "bool", "dyn", "type", "duration", "timestamp",
    "matches", "quantity", "isQuantity", "semver", "isSemver", "url", "isURL", "ip", "isIP", "cidr", "isCIDR",
})
# Namespaces of qualified functions: cel.bind, sets.contains, optional.of, strings.quote, lists.range, ...
NAMESPACES = frozenset({"cel", "sets", "optional", "strings", "lists", "math", "base64", "google"})
# `device` is an object type: a field it lacks is a compile error ("undefined field").
DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
# Macros whose first (and, for two-variable forms, second) argument names a variable.
BINDING_MACROS = frozenset({"all", "exists", "exists_one", "existsOne", "map", "filter", "transformList",
                            "transformMap", "transformMapEntry", "sortBy", "optMap", "optFlatMap"})
KEYWORDS = frozenset({"true", "false", "null", "in"})

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>//[^\n]*)
      | (?P<string>
            [rR][bB]?(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
          | [bB][rR](?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
          | [bB]?(?:\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'''(?:\\[\s\S]|[^\\])*?'''
                  |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
      | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[uU]?)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


def _tokens(expression: str) -> list[tuple[str, str]] | None:
    """(kind, text) of each token but spaces and comments; None when a quote is left open."""
    out = []
    for match in _TOKEN.finditer(expression):
        kind = match.lastgroup or "other"
        if kind in ("space", "comment"):
            continue
        if kind == "other" and match.group() in "\"'":
            return None
        out.append((kind, match.group()))
    return out


def _bound_names(tokens: list[tuple[str, str]]) -> set[str]:
    """Every name a macro or cel.bind binds, wherever it is in the expression."""
    bound = set()
    for i in range(len(tokens) - 3):
        kind, text = tokens[i + 1]
        if tokens[i][1] != "." or kind != "ident" or tokens[i + 2][1] != "(" or tokens[i + 3][0] != "ident":
            continue
        is_bind = text == "bind" and i > 0 and tokens[i - 1][1] == "cel"
        if text in BINDING_MACROS or is_bind:
            bound.add(tokens[i + 3][1])
            if (not is_bind and i + 6 < len(tokens) and tokens[i + 4][1] == "," and tokens[i + 5][0] == "ident"
                    and tokens[i + 6][1] == ","):
                bound.add(tokens[i + 5][1])
    return bound


def _quoted(name: str) -> str:
    """A name for a message: an identifier has no quotes or control characters, but may be 10 KiB long."""
    return repr(name if len(name) <= 64 else name[:64] + "...")


@lru_cache(maxsize=4096)
def undeclared_references(expression: str) -> tuple[str, ...]:
    """What Kubernetes' compiler would refuse in `expression` for naming something it does not declare,
    as messages ("undeclared reference to 'gpu'"); empty when nothing is found."""
    tokens = _tokens(expression)
    if tokens is None:
        return ()
    bound = _bound_names(tokens)
    problems: list[str] = []
    for i, (kind, name) in enumerate(tokens):
        if kind != "ident" or name in KEYWORDS:
            continue
        before = tokens[i - 1][1] if i > 0 else ""
        after = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if before == "." or (before == "?" and i > 1 and tokens[i - 2][1] == "."):
            owner = i - 2 if before == "." else i - 3
            if (owner >= 0 and tokens[owner] == ("ident", "device") and (owner == 0 or tokens[owner - 1][1] != ".")
                    and "device" not in bound and name not in DEVICE_FIELDS):
                problems.append(f"undefined field {_quoted(name)} of device (it has {', '.join(DEVICE_FIELDS)})")
            continue  # a field or a method
        if after == ":":
            continue  # a map key or a ternary branch: left unchecked
        if after == "(":
            if name not in GLOBAL_FUNCTIONS:
                problems.append(f"undeclared reference to {_quoted(name)} (no such function)")
        elif after == "." and name in NAMESPACES:
            continue
        elif name not in DECLARED and name not in bound:
            problems.append(f"undeclared reference to {_quoted(name)} (the only variable is device)")
    return tuple(dict.fromkeys(problems))
