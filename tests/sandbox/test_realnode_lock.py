"""The real node changes the host (a bridge, nftables, cgroups, kubelet's paths) only while it
holds the machine-wide lock: a sandbox stopped while it waited for another run's node must
leave that node's host alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.sandbox import realnode
from tidal.sandbox.pki import make_pki


def _node(tmp_path: Path) -> realnode.RealNode:
    return realnode.RealNode(
        api_url="https://127.0.0.1:1", pki=make_pki(tmp_path / "pki"), log_dir=tmp_path / "logs"
    )


def test_a_node_that_never_held_the_lock_cleans_nothing_on_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cleaned: list[str] = []
    monkeypatch.setattr(realnode, "cleanup_host", lambda: cleaned.append("host") or [])
    node = _node(tmp_path)
    node.stop()  # e.g. SIGTERM while prepare_host() waited for another run's lock
    assert cleaned == []


def test_the_lock_holder_cleans_the_host_on_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cleaned: list[str] = []
    monkeypatch.setattr(realnode, "cleanup_host", lambda: cleaned.append("host") or [])
    node = _node(tmp_path)
    node._holds_lock = True  # as prepare_host() leaves it once the lock is taken
    node.stop()
    node.stop()  # twice (stop on failure, then at exit): cleaned once
    assert cleaned == ["host"]
