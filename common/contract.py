"""What the operator and the runtime must agree on, in one place (``tidal.common.contract``).

The operator writes a runtime pod's environment and its configuration (JSON in
:data:`ENV_RUNTIME_CONFIG_JSON`); the runtime reads them. Both read Kubernetes quantities
("20Gi", "512Mi", "1.5G") as bytes, and the operator plans with the engine budget the runtime
takes when ``spec.memory.engineCacheBudget`` is unset. Were any of these defined on each side,
they could drift apart unnoticed; here there is one of each, and ``tests/test_contract.py``
checks that both sides use them.

Quantities follow the CRD: a number with an optional fraction and an optional suffix, with no
spaces and no ``B``; a byte quantity (:data:`BYTES_PATTERN`, the CRD's byte fields) has no
``m`` suffix and is a whole number of bytes below 2^63. Values are computed exactly (decimal),
never through a float.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# The value of each suffix of a Kubernetes quantity (m is milli: 1500m is 1.5).
QUANTITY_UNITS: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    **{unit: Decimal(1000) ** power for power, unit in enumerate("kMGTPE", start=1)},
    **{f"{unit}i": Decimal(1024) ** power for power, unit in enumerate("KMGTPE", start=1)},
}
# Byte counts as the CRD's byte fields take them: no milli suffix, and a fraction only before a
# unit (is_whole_bytes then rejects the fractions of a byte that remain, such as 1.0001k).
BYTES_PATTERN = r"^([0-9]+|[0-9]+(\.[0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))$"
BYTES_MESSAGE = (
    "must be a whole number of bytes, such as 20Gi, 1500Mi or 1.5G (no m suffix, no fraction "
    "of a byte)"
)

# Device bytes for loaded engines when spec.memory.engineCacheBudget is unset: the runtime's
# default, and what the operator's placement and checks assume of it.
DEFAULT_ENGINE_CACHE_BUDGET_BYTES = 8 * 2**30

# Ports the runtime listens on in a pod (HTTP: OIP v2 REST and metrics; gRPC: OIP v2 gRPC).
RUNTIME_HTTP_PORT = 8080
RUNTIME_GRPC_PORT = 8081

# Every tidal process's own variables start with this (tidal.common.settings reads a setting
# ``foo_bar`` from TIDAL_FOO_BAR).
ENV_PREFIX = "TIDAL_"
# Environment variables the operator sets in the runtime container and the runtime reads.
ENV_HOST = "TIDAL_HOST"
ENV_POD_IP = "POD_IP"
ENV_PORT = "TIDAL_PORT"
ENV_GRPC_PORT = "TIDAL_GRPC_PORT"
ENV_POD_NAME = "POD_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_LOG_LEVEL = "TIDAL_LOG_LEVEL"
ENV_RUNTIME_CONFIG_JSON = "TIDAL_RUNTIME_CONFIG_JSON"
# All of them, in the order the CRD's message lists them (users may not set these).
RUNTIME_ENV_NAMES = (
    ENV_HOST,
    ENV_POD_IP,
    ENV_PORT,
    ENV_GRPC_PORT,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_LOG_LEVEL,
    ENV_RUNTIME_CONFIG_JSON,
)
# A runtime configuration file's path (read when there is no --config; before the inline JSON).
ENV_RUNTIME_CONFIG = "TIDAL_RUNTIME_CONFIG"

# The gateway's environment (the operator sets the configuration, host and ports; the event
# loop is the gateway's own choice).
ENV_GATEWAY_CONFIG_JSON = "TIDAL_GATEWAY_CONFIG_JSON"
ENV_EVENT_LOOP = "TIDAL_EVENT_LOOP"
GATEWAY_ENV_NAMES = (
    ENV_HOST,
    ENV_PORT,
    ENV_GRPC_PORT,
    ENV_POD_NAME,
    ENV_LOG_LEVEL,
    ENV_EVENT_LOOP,
    ENV_GATEWAY_CONFIG_JSON,
)


def quantity_value(value: str) -> Decimal:
    """The exact value of a Kubernetes quantity such as ``20Gi`` or ``1500m``.

    Raises ``ValueError`` for anything else (a sign, spaces, an unknown suffix, a percentage).
    """
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", value)
    if match is None or match.group(2) not in QUANTITY_UNITS:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None
    return number * QUANTITY_UNITS[match.group(2)]


def quantity_bytes(value: str) -> int:
    """Bytes of a Kubernetes quantity such as ``20Gi`` (no percentages; rounded down)."""
    return int(quantity_value(value))


def is_whole_bytes(value: str) -> bool:
    """Whether a quantity is a whole number of bytes below 2^63 (the CRD's CEL rule)."""
    try:
        exact = quantity_value(value)
    except ValueError:
        return False
    return exact == exact.to_integral_value() and exact < 2**63


def parse_byte_quantity(value: str) -> int:
    """Bytes of a byte quantity as the CRD's byte fields accept it (``4096``, ``512Mi``,
    ``1.5G``); ``ValueError`` for anything those fields refuse."""
    if re.fullmatch(BYTES_PATTERN, value) is None or not is_whole_bytes(value):
        raise ValueError(f"{value!r} {BYTES_MESSAGE}")
    return quantity_bytes(value)
