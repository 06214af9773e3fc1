"""End to end: two operator processes for one scope, one leader elected through a Lease.

Two ``tidal-operator --leader-elect --lease-seconds 6`` processes watch the same namespace. The
first holds the Lease and reconciles; the second waits without starting any watch. The leader
is SIGKILLed and the spec edited at once: the follower takes the Lease once it has seen it
unrenewed for the lease duration, and acts on the edit. Then a clean shutdown: the new leader
gets SIGTERM, releases the Lease, and a third process, waiting as a follower, takes over within
a retry period instead of waiting out the lease.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from scenario import apply, install_crd, model_service

from tidal.operator.__main__ import lease_name
from tidal.sandbox.operatorproc import OperatorProcess
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(240)]

LEASE_SECONDS = 6


def _holder(sandbox: Any, namespace: str) -> str | None:
    out = sandbox.kubectl(
        "get", "lease", lease_name([namespace]), "-n", namespace, "-o", "json", check=False
    )
    if out.returncode != 0:
        return None
    return (json.loads(out.stdout).get("spec") or {}).get("holderIdentity")


def _replicas(sandbox: Any, namespace: str, name: str) -> int | None:
    out = sandbox.kubectl(
        "get", "deployment", f"{name}-primary", "-n", namespace, "-o", "json", check=False
    )
    if out.returncode != 0:
        return None
    return int(json.loads(out.stdout)["spec"].get("replicas") or 0)


def _candidate(sandbox: Any, namespace: str, log: Path) -> OperatorProcess:
    proc = OperatorProcess({**os.environ, **sandbox.env}, namespace, log, "plain")
    return proc.start("--leader-elect", "--lease-seconds", str(LEASE_SECONDS))


def test_one_leader_reconciles_and_a_follower_takes_over(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "elected"
    first = _candidate(sandbox, namespace, tmp_path / "first.log")
    second: OperatorProcess | None = None
    third: OperatorProcess | None = None
    try:
        leader = wait_for(lambda: _holder(sandbox, namespace), timeout=60, what="a lease holder")
        second = _candidate(sandbox, namespace, tmp_path / "second.log")
        wait_for(lambda: "waiting as a follower" in second.log(), timeout=60, what="second waits")
        manifest = model_service(
            name,
            tmp_path / "mlp.onnx",
            env={},
            autoscaling={"minReplicas": 1, "maxReplicas": 3},
        )
        manifest["spec"]["replicas"] = 1
        apply(sandbox, namespace, manifest)
        wait_for(lambda: _replicas(sandbox, namespace, name) == 1, timeout=60, what="reconciled")
        assert "watching" in first.log() and "watching" not in second.log()

        # The leader dies mid-flight; the spec changes at once.
        first.kill()
        killed = time.monotonic()
        manifest["spec"]["replicas"] = 2
        apply(sandbox, namespace, manifest)
        wait_for(
            lambda: _replicas(sandbox, namespace, name) == 2,
            timeout=LEASE_SECONDS * 4,
            what="the follower acting on the edit",
        )
        took_over = time.monotonic() - killed
        new_leader = _holder(sandbox, namespace)
        assert new_leader is not None and new_leader != leader
        assert "leading:" in second.log()

        # A clean shutdown releases the Lease: a waiting follower takes over within seconds.
        third = _candidate(sandbox, namespace, tmp_path / "third.log")
        wait_for(lambda: "waiting as a follower" in third.log(), timeout=60, what="third waits")
        second.stop()
        stopped = time.monotonic()
        wait_for(lambda: "leading:" in third.log(), timeout=LEASE_SECONDS * 3, what="handover")
        handed_over = time.monotonic() - stopped
        print(
            f"\nleader SIGKILLed -> edit acted on by the follower {took_over:.1f}s "
            f"(lease {LEASE_SECONDS} s); SIGTERM -> follower leads {handed_over:.1f}s"
        )
        assert took_over <= LEASE_SECONDS * 3, took_over
        assert handed_over < LEASE_SECONDS, handed_over  # released, not expired
        assert "released Lease" in second.log()
    finally:
        for proc in (first, second, third):
            if proc is not None:
                proc.stop()
