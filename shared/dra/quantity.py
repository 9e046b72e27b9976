"""Kubernetes resource quantities ("80Gi", "500m", "1.5e3") as exact rationals.

Capacities in ResourceSlices and CEL's ``quantity()`` compare by value, so "1Gi" equals
"1024Mi"; Fraction keeps that exact without float rounding.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache, total_ordering

_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
# 10 raised to the exponent is computed exactly, in one C call nothing can interrupt: "1e999999" would take
# 0.2 s and "1e999999999999" never return (a ResourceSlice capacity or a claim's CEL could hang a service), so
# the exponent is bounded. Kubernetes quantities stay within int64 anyway.
MAX_EXPONENT = 100
_PATTERN = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


@total_ordering
class Quantity:
    """An exact Kubernetes quantity; keeps the text it was parsed from for display."""

    __slots__ = ("text", "value")

    def __init__(self, text: str) -> None:
        match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"invalid quantity {text!r}: expected a number with an optional suffix like 80Gi")
        number, exponent, suffix = match.groups()
        value = Fraction(number)
        if exponent:
            power = exponent[1:]
            if len(power) > 6 or abs(int(power)) > MAX_EXPONENT:
                raise ValueError(f"invalid quantity {text[:40]!r}: the exponent may be at most {MAX_EXPONENT}")
            value *= Fraction(10) ** int(power)
        else:
            value *= _SUFFIXES[suffix or ""]
        self.text = text.strip()
        self.value = value

    @classmethod
    def of(cls, value: Fraction | int) -> Quantity:
        q = cls.__new__(cls)
        q.value = Fraction(value)
        q.text = str(q.value) if q.value.denominator == 1 else f"{float(q.value):g}"
        return q

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({self.text!r})"

    def __str__(self) -> str:
        return self.text

    def humanize(self) -> str:
        """Bytes as GiB for reasons people read ("79.6 GiB")."""
        gib = self.value / 2**30
        return f"{float(gib):.1f} GiB" if gib >= 1 else self.text


@lru_cache(maxsize=65_536)
def parse_quantity(text: str) -> Quantity:
    """Quantities are immutable and fleets repeat the same few texts ("81559Mi", "1"): parse each once."""
    return Quantity(text)


def exact(value: Fraction) -> int | Fraction:
    """An int where the quantity is whole: counters are compared millions of times, ints compare fast."""
    return value.numerator if value.denominator == 1 else value
