"""pytest fixtures for tests and end-to-end scenarios: sandboxes (a real control plane and
Prometheus) shared by a test run, and a fresh namespace per test.

* ``agent_sandbox``: two nodes of the node agent (pods as local processes of this checkout) and
  one fake node. What ``sandbox`` is under ``tests/``: API, chart and operator tests that need a
  cluster but not containers, and the node agent's own tests.
* ``real_sandbox``: the real node (kubelet, containerd, kube-proxy, CoreDNS; the project's images)
  with 4 ``nvidia.com/gpu``, and one fake node of the node agent (pods that only need to exist,
  for the metrics-at-scale checks). What ``sandbox`` is under ``e2e/`` (e2e/conftest.py);
  ``TIDAL_E2E_NODE=agent`` runs the scenarios on the node agent instead (a machine without root
  or nftables). One real node per machine: it is a session fixture, started at first use.

Loaded by the repository's top-level ``conftest.py``. Tests that use the sandbox are marked
``sandbox`` automatically, so ``pytest -m "not sandbox"`` runs only the fast ones.
Set ``TIDAL_KEEP_SANDBOX=1`` to keep the sandbox's state (logs, pod logs) after the run."""

from __future__ import annotations

import os
import re
import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from . import Sandbox, SandboxConfig
from .wait import wait_for


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI time limit, ``kill``) ends the run like Ctrl-C, so fixtures tear down:
    sandboxes stop their processes and the real node undoes its host changes."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Mark a test whose setup or body failed, for fixtures that print diagnostics on failure
    (`failed`)."""
    report = yield
    if report.failed and report.when in ("setup", "call"):
        item.stash[FAILED] = True
    return report


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the requesting test has failed so far (call it from a fixture's teardown)."""
    return bool(request.node.stash.get(FAILED, False))


def print_namespace(sandbox: Sandbox, namespace: str) -> None:
    """What a failure message needs about a namespace: its objects, their status, its events."""
    import sys

    parts = []
    for args in (
        ("get", "inferenceservices,deployments,pods,services", "-o", "wide"),
        ("get", "inferenceservices", "-o", "yaml"),
        ("get", "events", "--sort-by=.lastTimestamp"),
    ):
        try:
            out = sandbox.kubectl(*args, "-n", namespace, check=False, timeout=30)
            parts.append(f"$ kubectl {' '.join(args)}\n{out.stdout}{out.stderr}")
        except Exception as exc:  # diagnostics must not hide the failure
            parts.append(f"$ kubectl {' '.join(args)}: {exc!r}")
    sys.stderr.write(f"\n--- namespace {namespace} at failure ---\n" + "\n".join(parts)[-30000:])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sandbox)


def _session_sandbox(
    tmp_path_factory: pytest.TempPathFactory, name: str, **config: Any
) -> Iterator[Sandbox]:
    keep = os.environ.get("TIDAL_KEEP_SANDBOX") == "1"
    state = tmp_path_factory.mktemp(name) if keep else None
    with Sandbox(SandboxConfig(state_dir=state, keep_state=keep, **config)) as sb:
        yield sb


@pytest.fixture(scope="session")
def agent_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from _session_sandbox(tmp_path_factory, "sandbox", nodes=2, gpus_per_node=2, fake_nodes=1)


@pytest.fixture(scope="session")
def real_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from _session_sandbox(
        tmp_path_factory, "realnode", nodes=0, fake_nodes=1, real_node=True, real_node_gpus=4
    )


@pytest.fixture(scope="session")
def sandbox(agent_sandbox: Sandbox) -> Sandbox:
    """The node agent's sandbox; e2e/conftest.py makes it the real node's for the scenarios."""
    return agent_sandbox


@pytest.fixture
def namespace(sandbox: Sandbox, request: pytest.FixtureRequest) -> Iterator[str]:
    from kubernetes import client

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    # 10 hex digits: with 5, two of a parametrized test's ~140 cases (same 40-character base)
    # collided about once in a hundred runs, the second meeting the first's terminating namespace.
    name = f"{base}-{uuid.uuid4().hex[:10]}"
    api = client.CoreV1Api(sandbox.api_client())
    api.create_namespace({"metadata": {"name": name, "labels": {"tidal.dev/test": "true"}}})
    wait_for(
        lambda: api.read_namespaced_service_account("default", name),
        timeout=30,
        what=f"default service account in {name}",
    )
    yield name
    if failed(request):
        print_namespace(sandbox, name)
    api.delete_namespace(name)
