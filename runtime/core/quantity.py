"""Parsing of byte quantities ("20Gi", "512Mi", 1048576) and fractions ("60%")."""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS: dict[str, int] = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kMGT]i?|)B?\s*$")


def parse_bytes(value: int | float | str) -> int:
    """Bytes from an int or a Kubernetes-style quantity string ("20Gi", "1.5G", "4096")."""
    if isinstance(value, bool):
        raise ValueError("a byte quantity must be a number or a string like '20Gi'")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a byte quantity cannot be negative")
        return value
    if isinstance(value, float):
        if value < 0 or not value.is_integer():
            raise ValueError("a byte quantity must be a whole, non-negative number of bytes")
        return int(value)
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a byte quantity (expected e.g. 4096, '512Mi', '20Gi')")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit])


@dataclass(frozen=True)
class Fraction:
    """A share of something, 0 < value <= 1, written as "60%" in configuration."""

    value: float


def parse_bytes_or_fraction(value: int | float | str) -> int | Fraction:
    """Either an absolute byte count or a percentage ("60%")."""
    if isinstance(value, str) and value.strip().endswith("%"):
        number = float(value.strip()[:-1])
        if not 0 < number <= 100:
            raise ValueError(f"{value!r}: a percentage must be in (0, 100]")
        return Fraction(number / 100.0)
    return parse_bytes(value)
