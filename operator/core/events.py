"""What the operator posts as Kubernetes Events, for both kinds it owns.

ModelBuild's decisions (``core.builds``) and InferenceService's (``core.status``, the control
loop) both return :class:`EventSpec` values and stamp times with :func:`timestamp`; this module
sits below both, so neither climbs into the other's decision stack to reach them (an
import-linter contract keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal


@dataclass(frozen=True)
class EventSpec:
    """An Event to post on the object the decision is about."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def timestamp(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time serialises."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
