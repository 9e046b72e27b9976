"""Kubernetes' CEL library for device selectors: quantities and semantic versions as values, their
functions (quantity(), compareTo(), semver(), ...), and the `device` variable as DRA builds it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy.celtypes as ct

from shared.dra.quantity import Quantity, parse_quantity


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
