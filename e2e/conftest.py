"""The end-to-end scenarios run on the real node (kubelet, containerd, kube-proxy, CoreDNS and
the project's images): ``sandbox`` here is the session's ``real_sandbox``.
``TIDAL_E2E_NODE=agent`` runs them under the node agent instead, where the real node cannot
run (no root, no nftables); the scenarios are written for both (``Sandbox.adapt``,
``Sandbox.engine_uri``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.sandbox import Sandbox


@pytest.fixture(scope="session")
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    node = os.environ.get("TIDAL_E2E_NODE", "real")
    if node not in ("real", "agent"):
        raise pytest.UsageError(f"TIDAL_E2E_NODE={node!r}: 'real' or 'agent'")
    sb: Sandbox = request.getfixturevalue("real_sandbox" if node == "real" else "agent_sandbox")
    return sb


# The real node starts with the first test that asks for it: building the images when `make
# images` has not (make test builds them first), or waiting for another real node on this machine
# to stop (realnode.py's lock). That is fixture setup, which pytest-timeout counts in the test's
# own limit, so the first such test of the run gets this much more.
NODE_START_ALLOWANCE_S = 3000


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        names = getattr(item, "fixturenames", ())
        if not item.path.is_relative_to(here):
            continue  # tests/: the node agent's sandbox
        if "sandbox" in names or "real_sandbox" in names:
            marker = item.get_closest_marker("timeout")
            limit = float(marker.args[0]) if marker and marker.args else 300.0
            item.add_marker(pytest.mark.timeout(limit + NODE_START_ALLOWANCE_S))
            return
