"""Parsing of byte quantities ("20Gi", "512Mi", 1048576) and fractions ("60%").

A quantity string is read by :func:`tidal.common.contract.parse_byte_quantity`, the reading the
operator's CRD documents and the operator itself uses, so that a budget means the same bytes on
both sides."""

from __future__ import annotations

from dataclasses import dataclass

from ...common.contract import parse_byte_quantity


def parse_bytes(value: int | float | str) -> int:
    """Bytes from an int or a Kubernetes byte quantity string ("20Gi", "1.5G", "4096")."""
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
    return parse_byte_quantity(value)


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
