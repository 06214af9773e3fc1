"""tidal's own pieces on the sandbox: the operator as a child process, and reading an
InferenceService back. Shared by the demo, the end-to-end scenarios, the operator tests and the
operator benchmark."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


class OperatorProcess:
    """``tidal-operator`` as a child process watching one namespace; restartable, killable."""

    def __init__(
        self, env: Mapping[str, str], namespace: str, log_path: Path, log_format: str = "full"
    ) -> None:
        self.env = dict(env)
        self.namespace = namespace
        self.log_path = log_path
        self.log_format = log_format
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self, *extra: str) -> OperatorProcess:
        """Start it; ``extra`` flags override the defaults (ports 0, one namespace)."""
        assert self.proc is None or self.proc.poll() is not None
        with self.log_path.open("ab") as log:
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
                    self.log_format,
                    *extra,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, as if the node died mid-reconcile."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL when it does not exit within 15 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> OperatorProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def get_isvc(sandbox: Any, namespace: str, name: str) -> dict[str, Any]:
    """The InferenceService as the API server has it."""
    out = sandbox.kubectl("get", "inferenceservice", name, "-n", namespace, "-o", "json")
    return dict(json.loads(out.stdout))


def condition(body: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The condition of type ``kind`` in an object's status ({} when absent)."""
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


_HTTP_403 = re.compile(
    r"status=403|code['\"]?:\s*403|\(403\)|HTTP/1\.[01]\" 403 |-> 403|403 Forbidden|forbidden",
    re.IGNORECASE,
)


# The API server's answer to a write into a namespace being deleted (NamespaceLifecycle): a 403
# that says nothing of permissions. An operator watching every namespace meets it on a shared
# cluster whenever a namespace goes away under a resource it was reconciling.
_NOT_A_PERMISSION = "because it is being terminated"


def http_forbidden(log: str) -> str | None:
    """The first HTTP 403 in an operator log, in the forms the kubernetes client, kopf and
    aiohttp print it (``status=403``, ``'code': 403``, ``(403)``, ``-> 403``, ``Forbidden``);
    not any "403": CI matched a timestamp's milliseconds, and a random identity's hex digits;
    nor a write refused because its namespace is being deleted (not a permission)."""
    for found in _HTTP_403.finditer(log):
        line_start = log.rfind("\n", 0, found.start()) + 1
        line_end = log.find("\n", found.end())
        if _NOT_A_PERMISSION in log[line_start : line_end if line_end >= 0 else len(log)]:
            continue
        return log[max(found.start() - 300, 0) : found.end() + 300]
    return None
