"""The formats of the API's values: regular expressions for names, URIs and quantities, the
constrained string types built from them (:data:`Quantity`, :data:`ByteQuantity`,
:data:`Percent`, :data:`Duration`, ...), and the functions that read quantities, percentages
and durations as numbers. Each constrained type carries its pydantic check and, where a regex
cannot say it, its CEL rule, so that the API server and the operator agree. Quantities are read
as the runtime reads them: by :mod:`tidal.common.contract`."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
)

from ....common.contract import (
    BYTES_MESSAGE,
    BYTES_PATTERN,
    is_whole_bytes,
    quantity_value,
)
from .base import _matches, _rules, cel

# Kubernetes quantities ("20Gi", "512Mi", "1.5G") and percentages ("60%"). Bounds on the
# percentage are checked by CEL (below) because a regex bound on a number reads badly.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
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


def quantity_cmp(left: str, right: str) -> int:
    """-1, 0 or 1 as quantity ``left`` is below, equal to or above ``right`` (exact)."""
    a, b = quantity_value(left), quantity_value(right)
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
