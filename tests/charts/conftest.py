"""Fixtures of the chart and image checks (helpers live in chart_helpers.py)."""

from __future__ import annotations

import pytest
from chart_helpers import Helm, ensure_helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    """The helm binary (built from the Go module proxy on first use)."""
    return Helm(ensure_helm())
