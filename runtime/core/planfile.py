"""The TensorRT plan-file header: magic tag, serialization version and TensorRT version.

A serialized engine ("plan") starts with a 28-byte header.  Bytes 0-3 hold the little-endian
tag ``0x74727466``; bytes 4-7 the serialization version; for serialization version 0, bytes
24-27 hold the TensorRT version that built it (major, minor, patch, build) — the same fields
``trtexec --getPlanVersionOnly`` prints.  Checking them before deserializing turns TensorRT's
"Serialization assertion stdVersionRead == kSERIALIZATION_VERSION failed" into a clear error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PLAN_TAG = 0x74727466
PLAN_HEADER_BYTES = 28


class PlanHeaderError(ValueError):
    """The bytes are not a TensorRT plan this code can read the header of."""


@dataclass(frozen=True)
class PlanHeader:
    serialization_version: int
    trt_version: tuple[int, int, int, int]

    @property
    def trt_version_text(self) -> str:
        return ".".join(str(part) for part in self.trt_version)


def parse_plan_header(head: bytes) -> PlanHeader:
    """Read the header from the first 28 (or more) bytes of a plan file."""
    if len(head) < PLAN_HEADER_BYTES:
        raise PlanHeaderError(
            f"not a TensorRT plan: {len(head)} bytes, a plan header needs {PLAN_HEADER_BYTES}"
        )
    tag, serialization = struct.unpack_from("<II", head, 0)
    if tag != PLAN_TAG:
        raise PlanHeaderError(
            f"not a TensorRT plan: magic tag 0x{tag:08x} does not match 0x{PLAN_TAG:08x}"
        )
    if serialization != 0:
        raise PlanHeaderError(f"unsupported plan serialization version {serialization}")
    major, minor, patch, build = head[24], head[25], head[26], head[27]
    return PlanHeader(serialization_version=0, trt_version=(major, minor, patch, build))


def make_plan_header(trt_version: tuple[int, int, int, int]) -> bytes:
    """The 28 header bytes of a plan built by ``trt_version`` (for tests and fixtures)."""
    head = bytearray(PLAN_HEADER_BYTES)
    struct.pack_into("<II", head, 0, PLAN_TAG, 0)
    head[24:28] = bytes(trt_version)
    return bytes(head)


@dataclass(frozen=True)
class PlanCompatibility:
    compatible: bool
    reason: str


def check_plan_compatibility(
    header: PlanHeader, runtime_version: tuple[int, ...], version_compatible: bool
) -> PlanCompatibility:
    """Whether a runtime of ``runtime_version`` can deserialize this plan.

    A plan normally needs the exact TensorRT major.minor.patch that built it.  A plan built with
    ``VERSION_COMPATIBLE`` runs on any later runtime of the same major version (TensorRT's
    version-compatibility guarantee, which the lean runtime relies on).
    """
    built = header.trt_version[:3]
    running = tuple(runtime_version[:3])
    if built == running:
        return PlanCompatibility(True, f"exact:trt{header.trt_version_text}")
    if version_compatible:
        if built[0] == running[0] and built <= running:
            return PlanCompatibility(
                True, f"version-compatible:built-trt{_dotted(built)}-runs-on-{_dotted(running)}"
            )
        return PlanCompatibility(
            False,
            f"plan built by TensorRT {_dotted(built)} (version-compatible) cannot run on "
            f"TensorRT {_dotted(running)}: needs the same major version and a runtime at least "
            "as new",
        )
    return PlanCompatibility(
        False,
        f"plan built by TensorRT {_dotted(built)} but this runtime is TensorRT {_dotted(running)}"
        " (rebuild the engine, or build it with VERSION_COMPATIBLE)",
    )


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)
