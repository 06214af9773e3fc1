"""Fixtures of the operator's sandbox tests: the CRD installed once, an operator per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidal.sandbox.operatorproc import OperatorProcess
from tidal.sandbox.pytest_plugin import failed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def isvc_crd(sandbox: Any) -> None:
    sandbox.apply_crds(REPO / "crds")


@pytest.fixture
def operator(
    sandbox: Any,
    namespace: str,
    isvc_crd: None,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    env = {**os.environ, **sandbox.env}
    proc = OperatorProcess(env, namespace, tmp_path / "operator.log")
    proc.start()
    yield proc
    proc.stop()
    if failed(request) or os.environ.get("TIDAL_SHOW_OPERATOR_LOG") == "1":
        sys.stderr.write("\n--- operator log (tail) ---\n" + proc.log()[-20000:])
