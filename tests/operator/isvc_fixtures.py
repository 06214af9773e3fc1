"""Shared helpers of the operator tests: example and invalid manifests, a minimal valid spec."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INVALID = Path(__file__).resolve().parent / "invalid"
EXAMPLE_MODEL_PREFIX = "file:///var/lib/tidal/models/"


def example_paths(include_gpu: bool = True) -> list[Path]:
    paths = sorted(EXAMPLES.glob("*.yaml"))
    if include_gpu:
        paths += sorted((EXAMPLES / "gpu").glob("*.yaml"))
    return paths


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def invalid_cases() -> list[tuple[Path, dict[str, str], dict[str, Any]]]:
    """(path, header {field, expect, rule}, manifest) for each invalid manifest."""
    cases = []
    for path in sorted(INVALID.glob("*.yaml")):
        text = path.read_text()
        header = {}
        for line in text.splitlines():
            if not line.startswith("# "):
                break
            key, _, value = line[2:].partition(": ")
            header[key] = value
        cases.append((path, header, dict(yaml.safe_load(text))))
    return cases


def minimal(name: str = "svc", namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    """A valid InferenceService body (as the API server returns it: uid, generation)."""
    body: dict[str, Any] = {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "uid": "u-1", "generation": 1},
        "spec": {
            "runtime": {"backend": "onnxruntime"},
            "models": [{"name": "m", "engines": [{"uri": "file:///models/m.onnx"}]}],
        },
    }
    body["spec"].update(spec)
    return body


class OperatorProcess:
    """``tidal-operator`` as a child process watching one namespace; restartable, killable."""

    def __init__(self, env: dict[str, str], namespace: str, log_path: Path) -> None:
        self.env = env
        self.namespace = namespace
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *extra: str) -> None:
        assert self.proc is None or self.proc.poll() is not None
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidal.operator",
                "--namespace",
                self.namespace,
                "--metrics-port",
                "0",
                "--health-port",
                "0",
                "--log-format",
                "full",
                *extra,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        log.close()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as if the node died mid-reconcile."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
