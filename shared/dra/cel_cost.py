"""The worst-case cost of a selector, estimated from its syntax tree before it is ever evaluated, as
Kubernetes estimates it: a selector too deep or too costly is refused at compile time.

Kubernetes refuses selectors over 10 KiB (MAX_CEL_LENGTH) or with an estimated cost over 1,000,000;
cel-python has no such limits. The estimate here counts cel-python's syntax-tree nodes, several per cel-go
cost unit: stricter for the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lark import Tree

from shared.dra.cel_errors import SelectorError, too_deep

MAX_COST = 1_000_000
# Each nesting level is about 5 Python frames when cel-python evaluates (measured on 3.11: 4.5 for
# brackets, 5.0 for chained operators and unary minus); celpy raises the recursion limit to 2,500, so
# 250 levels use about 1,250 frames and leave as many to the caller. Each pair of brackets costs 9 to 11
# levels, each chained operator (&&, ||, +) or unary operator one.
MAX_TREE_DEPTH = 250
# More nested brackets than this always make a tree deeper than MAX_TREE_DEPTH: refused before parsing
# (lark needs 0.3 s for 5,000 nested parentheses).
MAX_NESTING = 32

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


def bracket_nesting(text: str) -> int:
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


def bare_identifier(node: Any) -> str | None:
    """The name when `node` is a plain identifier (a macro's or cel.bind's variable), else None."""
    while isinstance(node, Tree) and len(node.children) == 1 and node.data in _WRAPPERS:
        node = node.children[0]
    if isinstance(node, Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def is_bind(tree: Tree[Any]) -> bool:
    return len(tree.children) == 3 and tree.children[1] == "bind" and bare_identifier(tree.children[0]) == "cel"


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
            raise SelectorError(too_deep(f"its syntax tree is over {MAX_TREE_DEPTH} levels deep"))
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
        if name == "bind" and bare_identifier(target) == "cel":
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
        variable = bare_identifier(arguments[0])
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
        variable = bare_identifier(arguments[0]) if len(arguments) == 3 else None
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
