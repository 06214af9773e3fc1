"""The formats of the API's values: regular expressions for names, URIs and quantities, the
constrained string types built from them (:data:`Quantity`, :data:`ByteQuantity`,
:data:`Percent`, :data:`Duration`, ...), and the functions that read quantities, percentages
and durations as numbers. Each constrained type carries its pydantic check and, where a regex
cannot say it, its CEL rule, so that the API server and the operator agree."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
)

from tidal.operator.core.api.base import _matches, _rules, cel

# Kubernetes quantities ("20Gi", "512Mi", "1.5G") and percentages ("60%"). Bounds on the
# percentage are checked by CEL (below) because a regex bound on a number reads badly.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# Byte counts: no milli suffix, and a fraction only before a unit (_whole_bytes_cel then
# rejects the fractions of a byte that remain, such as 1.0001k).
BYTES_PATTERN = r"^([0-9]+|[0-9]+(\.[0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))$"
BYTES_MESSAGE = (
    "must be a whole number of bytes, such as 20Gi, 1500Mi or 1.5G (no m suffix, no fraction "
    "of a byte)"
)
PERCENT_PATTERN = r"^[0-9]+(\.[0-9]+)?%$"
WEIGHT_STREAMING_PATTERN = r"^(auto|[0-9]+(\.[0-9]+)?((Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?|%))$"
# Go durations as CEL's duration() parses them, restricted to the units that make sense here.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
MODEL_NAME_PATTERN = r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$"
ENGINE_URI_PATTERN = r"^(file://.+|(s3|gs|https?)://[^/\s].*)$"
URI_SCHEMES = ("file://", "s3://", "gs://", "http://", "https://")
SHA256_PATTERN = r"^[a-f0-9]{64}$"
GPU_ARCH_PATTERN = r"^sm[0-9]{2,3}$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# Label keys and resource names (Kubernetes "qualified names": an optional DNS prefix and '/').
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QUALIFIED_NAME_MAX = 317  # a 253-character prefix, '/', a 63-character name
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
IMAGE_PATTERN = r"^[^\s]+$"

_UNITS: dict[str, float] = {
    "": 1,
    "m": 0.001,
    "E": 10**18,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def _quantity_value(value: str) -> Decimal:
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", value)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None
    unit = match.group(2)
    return number * (Decimal("0.001") if unit == "m" else Decimal(int(_UNITS[unit])))


def quantity_bytes(value: str) -> int:
    """Bytes of a Kubernetes quantity such as ``20Gi`` (no percentages; rounded down)."""
    return int(_quantity_value(value))


def is_whole_bytes(value: str) -> bool:
    """Whether a quantity is a whole number of bytes below 2^63 (the CRD's CEL rule)."""
    try:
        exact = _quantity_value(value)
    except ValueError:
        return False
    return exact == exact.to_integral_value() and exact < 2**63


def quantity_cmp(left: str, right: str) -> int:
    """-1, 0 or 1 as quantity ``left`` is below, equal to or above ``right`` (exact)."""
    a, b = _quantity_value(left), _quantity_value(right)
    return (a > b) - (a < b)


def percent_value(value: str) -> float | None:
    """The number in ``"60%"``, or None when the value is not a percentage."""
    return float(value[:-1]) if value.endswith("%") else None


def duration_seconds(value: str) -> float:
    """Seconds in a Go duration string such as ``90s`` or ``1m30s``."""
    factors = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(n) * factors[u] for n, u in parts)


def _whole_bytes_cel(expr: str) -> str:
    """CEL: the quantity ``expr`` is a whole number of bytes below 2^63. Not isInteger(): it
    is false for exact binary fractions such as 1.5Gi (stored as a decimal internally)."""
    value = f"quantity({expr}).asApproximateFloat()"
    return f"({value} < 9.2e18 && {value} == double(int({value})))"


def _whole_bytes(value: str) -> str:
    if not is_whole_bytes(value):
        raise ValueError(BYTES_MESSAGE)
    return value


Quantity = Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN, max_length=32)]
Percent = Annotated[str, StringConstraints(pattern=PERCENT_PATTERN, max_length=16)]
WeightStreamingBudget = Annotated[
    str, StringConstraints(pattern=WEIGHT_STREAMING_PATTERN, max_length=32)
]
Duration = Annotated[str, StringConstraints(pattern=DURATION_PATTERN, max_length=32)]
ByteQuantity = Annotated[
    str,
    StringConstraints(pattern=BYTES_PATTERN, max_length=32),
    AfterValidator(_whole_bytes),
    Field(
        json_schema_extra=_rules(
            cel(f"!{_matches('self', BYTES_PATTERN)} || {_whole_bytes_cel('self')}", BYTES_MESSAGE)
        )
    ),
]
LabelValue = Annotated[str, StringConstraints(pattern=LABEL_VALUE_PATTERN, max_length=63)]


def _bad_qualified_keys(keys: Any) -> list[str]:
    return [
        k
        for k in keys
        if len(k) > QUALIFIED_NAME_MAX or re.fullmatch(QUALIFIED_NAME_PATTERN, k) is None
    ]
