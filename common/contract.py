"""What the operator, the runtime and the gateway must agree on, in one place
(``tidal.common.contract``).

The operator writes a runtime pod's environment and its configuration (JSON in
:data:`ENV_RUNTIME_CONFIG_JSON`); the runtime reads them. Both read Kubernetes quantities
("20Gi", "512Mi", "1.5G") as bytes, and the operator plans with the engine budget the runtime
takes when ``spec.memory.engineCacheBudget`` is unset. Were any of these defined on each side,
they could drift apart unnoticed; here there is one of each, and ``tests/test_contract.py``
checks that both sides use them.

The same holds for the names they meet by: the runtime's Prometheus metrics the operator reads
(``METRIC_*``; counters are exposed with ``_total``, histograms with ``_sum``, ``_count`` and
``_bucket``), the ``/v2/tidal/*`` endpoints (``PATH_*``) and the gateway's environment.

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

# The runtime's metrics the operator reads (Prometheus queries and pod scrapes): base names, as
# the runtime registers them (a counter's series add ``_total``, a histogram's ``_sum``...).
METRIC_QUEUE_DEPTH = "tidal_queue_depth"
METRIC_INFLIGHT_REQUESTS = "tidal_inflight_requests"
METRIC_REQUEST_DURATION_SECONDS = "tidal_request_duration_seconds"
METRIC_REQUESTS = "tidal_requests"
METRIC_ENGINE_LOAD_SECONDS = "tidal_engine_load_seconds"
METRIC_COLD_START_SECONDS = "tidal_cold_start_seconds"
METRIC_TRANSFER_WAIT_SECONDS = "tidal_transfer_wait_seconds"
METRIC_ENGINE_CACHE_HITS = "tidal_engine_cache_hits"
METRIC_ENGINE_CACHE_MISSES = "tidal_engine_cache_misses"
METRIC_GPU_MEMORY_BYTES = "tidal_gpu_memory_bytes"
METRIC_BACKEND_BATCHES = "tidal_backend_batches"
METRIC_BACKEND_ROWS = "tidal_backend_rows"
METRIC_BACKEND_REQUESTS = "tidal_backend_requests"
METRIC_BACKEND_SECONDS = "tidal_backend_seconds"
METRIC_BACKEND_ROW_SECONDS = "tidal_backend_row_seconds"
METRIC_BACKEND_ROWS_SQUARED = "tidal_backend_rows_squared"
METRIC_BACKEND_SLOTS = "tidal_backend_slots"
METRIC_MAX_BATCH_ROWS = "tidal_max_batch_rows"
METRIC_QUEUE_REACHABLE = "tidal_queue_reachable"
METRIC_REQUEST_TIMEOUT_SECONDS = "tidal_request_timeout_seconds"
METRIC_MODEL_READY = "tidal_model_ready"
METRIC_STARTUP_SECONDS = "tidal_startup_seconds"
RUNTIME_METRIC_NAMES: tuple[str, ...] = tuple(
    v for k, v in dict(globals()).items() if k.startswith("METRIC_")
)

# tidal's own HTTP endpoints beside OIP v2. The runtime serves the first three and /tier; the
# gateway serves /replicas and /held; the operator and the gateway call them.
PATH_MODELS = "/v2/tidal/models"  # GET: a runtime's hot set (long-poll with ?since=)
PATH_ACTIVITY = "/v2/tidal/activity"  # GET: a runtime's infer arrivals (long-poll)
PATH_PLACEMENT = "/v2/tidal/placement"  # PUT: the models pinned on a runtime
PATH_TIER = "/v2/tidal/tier"  # GET/PUT: a runtime's tier (device or host-warm standby)
PATH_REPLICAS = "/v2/tidal/replicas"  # GET/PUT: a gateway's replicas and placement
PATH_HELD = "/v2/tidal/held"  # GET: a gateway's held requests (long-poll)
TIDAL_PATHS = (PATH_MODELS, PATH_ACTIVITY, PATH_PLACEMENT, PATH_TIER, PATH_REPLICAS, PATH_HELD)


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
