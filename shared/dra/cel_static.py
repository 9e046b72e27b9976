"""What Kubernetes' CEL compiler refuses in a selector before any device is seen, found without evaluating it.

The API server compiles and type-checks a selector when a claim is created. The broker evaluates selectors
with cel-python, which only notices most of these problems when evaluation reaches them: in
`productName == "H100" || gpu.ready` the undeclared `gpu` is never read on an H100, so the claim would be
allocated although Kubernetes refuses it as written. Checked here, by the API server's rules:
- references: anything but `device`, the library's functions, type names and a macro's or cel.bind's own
  variables is an undeclared reference; a field `device` does not have is undefined;
- literals (the base environment's AST validators, Kubernetes 1.29+): a list or map literal mixing types
  (HomogeneousAggregateLiterals), a regular expression in `matches` that RE2 cannot compile, a
  `duration(...)` or `timestamp(...)` literal that does not parse;
- types: a ternary whose branches are literals of different types, an expression that is a single non-bool
  literal (a selector must evaluate to bool).

This reads tokens, not a syntax tree: linear in the text, so a reader can afford it for every submission.
It errs on the side of accepting: a variable bound anywhere in the expression counts as bound everywhere,
a name used as a map key or ternary branch (`x ? a : b`) is not checked, only literals are typed, and the
lists of functions and namespaces below are a superset of what Kubernetes declares. What it reports is
refused by Kubernetes; a selector it cannot tokenize is left to the CEL compiler, which reports the error.
"""

from __future__ import annotations

import re
from functools import lru_cache

import re2

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
# Where a ternary's false branch ends for sure (lower precedence than anything inside a branch).
_BRANCH_ENDS = frozenset({"", ")", "]", "}", ","})

_STRING = r"""(?P<string>
      [rR][bB]?(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
    | [bB][rR](?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"[^"\n]*"|'[^'\n]*')
    | [bB]?(?:\"\"\"(?:\\[\s\S]|[^\\])*?\"\"\"|'''(?:\\[\s\S]|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))"""
_TOKEN = re.compile(
    rf"""(?P<space>\s+)
      | (?P<comment>//[^\n]*)
      | {_STRING}
      | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[uU]?)
      | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_SIMPLE_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\'": "'", "\\n": "\n", "\\t": "\t", "\\r": "\r"}
_DURATION = re.compile(r"[-+]?(?:0|(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+)")
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})")
Token = tuple[str, str]


def _tokens(expression: str) -> list[Token] | None:
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


def _quoted(name: str) -> str:
    """A name for a message: an identifier has no quotes or control characters, but may be 10 KiB long."""
    return repr(name if len(name) <= 64 else name[:64] + "...")


def _literal_type(token: Token) -> str | None:
    """The CEL type of a literal token, None for anything else."""
    kind, text = token
    if kind == "string":
        return "bytes" if text[0] in "bB" or text[:2].lower() == "rb" else "string"
    if kind == "number":
        if text[-1] in "uU":
            return "uint"
        return "double" if not text.lower().startswith("0x") and any(c in text for c in ".eE") else "int"
    if kind == "ident" and text in ("true", "false"):
        return "bool"
    return "null_type" if token == ("ident", "null") else None


def _string_value(token: Token) -> str | None:
    """The text a string literal holds, where it is plain enough to know for sure (raw, or simple escapes)."""
    kind, text = token
    if kind != "string" or text[0] in "bB" or text[:2].lower() == "rb":
        return None
    raw = text[0] in "rR"
    body = text[1:] if raw else text
    quote = 3 if body[:3] in ('"""', "'''") else 1
    inner = body[quote:-quote]
    if raw:
        return inner
    value = re.sub(r"\\.", lambda m: _SIMPLE_ESCAPES.get(m.group(), "\0"), inner)
    return None if "\0" in value else value


def _bound_names(tokens: list[Token]) -> set[str]:
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


def _reference_problems(tokens: list[Token]) -> list[str]:
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
    return problems


def _literal_at(tokens: list[Token], i: int) -> tuple[str | None, int]:
    """The type of a literal starting at tokens[i] (a number may carry a unary minus) and where it ends."""
    if i < len(tokens) and tokens[i][1] == "-" and i + 1 < len(tokens) and tokens[i + 1][0] == "number":
        return _literal_type(tokens[i + 1]), i + 2
    if i < len(tokens):
        return _literal_type(tokens[i]), i + 1
    return None, i


def _aggregate_problems(tokens: list[Token]) -> list[str]:
    """List and map literals whose elements are all literals must hold one type each (keys, values)."""
    problems = []
    for i, (_, text) in enumerate(tokens):
        previous = tokens[i - 1] if i > 0 else ("other", "")
        follows_value = (previous[0] in ("string", "number") or previous[1] in (")", "]", "}")
                         or previous[0] == "ident" and previous[1] not in KEYWORDS)
        is_list = text == "[" and not follows_value  # else an index: x[0]
        if not is_list and text != "{":
            continue
        if text == "{" and previous[0] == "ident" and previous[1] not in KEYWORDS:
            continue  # a message literal: Type{field: value}
        closer = "]" if is_list else "}"
        slots: list[list[str]] = [[]] if is_list else [[], []]
        j, slot = i + 1, 0
        while j < len(tokens) and tokens[j][1] != closer:
            literal, j = _literal_at(tokens, j)
            if literal is None:
                slots = []
                break
            slots[slot].append(literal)
            separator = tokens[j][1] if j < len(tokens) else ""
            expected = "," if is_list or slot == 1 else ":"
            if separator == closer:
                break
            if separator != expected:
                slots = []
                break
            slot = 0 if is_list else 1 - slot
            j += 1
        for types in slots:
            mixed = [t for t in dict.fromkeys(types) if t != "null_type"]
            if len(mixed) > 1:
                what = "a list literal's elements" if is_list else (
                    "a map literal's keys" if types is slots[0] else "a map literal's values")
                problems.append(f"{what} mix {mixed[0]} and {mixed[1]}: Kubernetes' CEL requires them to have one type")
    return problems


def _regex_problem(pattern: str) -> str | None:
    """Why RE2 refuses `pattern` (Kubernetes compiles regular expressions with Go's regexp, RE2 syntax:
    no look-around or backreferences, repeats up to 1000); None when it compiles."""
    options = re2.Options()
    options.log_errors = False  # RE2 would log every refusal to stderr
    try:
        re2.compile(pattern, options)
    except re2.error as error:
        detail = error.args[0] if error.args else error
        return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
    return None


def _literal_argument_problems(tokens: list[Token]) -> list[str]:
    """matches(regex), duration(text) and timestamp(text) with a literal argument are checked when compiled."""
    problems = []
    for i, (kind, name) in enumerate(tokens):
        if kind != "ident" or i + 3 >= len(tokens) or tokens[i + 1][1] != "(":
            continue
        method = i > 0 and tokens[i - 1][1] == "."
        if name == "matches":
            # s.matches("re") or matches(s, "re"): the pattern is the last argument, a literal here
            k = i + 2 if method else i + 4
            if not method and (tokens[i + 3][1] != "," or i + 4 >= len(tokens)):
                continue
        elif name in ("duration", "timestamp") and not method:
            k = i + 2
        else:
            continue
        if k + 1 >= len(tokens) or tokens[k + 1][1] != ")":
            continue
        value = _string_value(tokens[k])
        if value is None:
            continue
        if name == "matches" and (problem := _regex_problem(value)) is not None:
            problems.append(f"invalid regular expression {_quoted(value)} in matches(): {problem}")
        elif name == "duration" and not _DURATION.fullmatch(value):
            problems.append(f"duration({_quoted(value)}) is not a duration such as 90s, 1h30m")
        elif name == "timestamp" and not _RFC3339.fullmatch(value):
            problems.append(f"timestamp({_quoted(value)}) is not an RFC 3339 time such as 2026-01-02T15:04:05Z")
    return problems


def _type_problems(tokens: list[Token]) -> list[str]:
    """A ternary with literal branches of different types, and a selector that is one non-bool literal."""
    problems = []
    literal, end = _literal_at(tokens, 0)
    if literal not in (None, "bool") and end == len(tokens):
        problems.append(f"the expression is a literal of type {literal}: a selector must evaluate to bool")
    for i, (_, text) in enumerate(tokens):
        if text != "?" or (i > 0 and tokens[i - 1][1] == "."):
            continue
        first, j = _literal_at(tokens, i + 1)
        if first is None or j >= len(tokens) or tokens[j][1] != ":":
            continue
        second, k = _literal_at(tokens, j + 1)
        ends = tokens[k][1] if k < len(tokens) else ""
        if second is not None and ends in _BRANCH_ENDS and "null_type" not in (first, second) and first != second:
            problems.append(f"a conditional's branches are {first} and {second}: both must have one type")
    return problems


@lru_cache(maxsize=256)  # keys are up to 10 KiB: at most 2.5 MiB held
def static_problems(expression: str) -> tuple[str, ...]:
    """What Kubernetes' compiler would refuse in `expression` before evaluating it, as messages
    ("undeclared reference to 'gpu'"); empty when nothing is found."""
    tokens = _tokens(expression)
    if not tokens:
        return ()
    problems = (_reference_problems(tokens) + _aggregate_problems(tokens) + _literal_argument_problems(tokens)
                + _type_problems(tokens))
    return tuple(dict.fromkeys(problems))
