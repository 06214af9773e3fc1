"""Managed child processes: started in their own session, logged to a file, stopped cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


class ManagedProcess:
    """A long-running child process with its output in ``log_path``.

    The child leads its own process group, so :meth:`stop` reaches everything it started.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; return the exit code."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        # Children that outlived the leader (they share its process group) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self._log.close()
        return self.popen.returncode

    def kill(self) -> int | None:
        """SIGKILL the process group at once (a crash, no cleanup); return the exit code."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        self._log.close()
        return self.popen.returncode

    def respawn(self) -> ManagedProcess:
        """The same command line, environment and log, started anew (after stop or kill)."""
        assert not self.alive(), f"{self.name} is still running"
        return ManagedProcess(self.name, self.argv, self.log_path, env=self.env, cwd=self.cwd)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_answering(process: ManagedProcess, url: str, timeout: float) -> None:
    """Wait until ``url`` gives any HTTP answer (an error status counts: the server serves) while
    ``process`` runs; otherwise stop it and raise with its log's tail."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except (TimeoutError, urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.1)
    process.stop()
    raise RuntimeError(
        f"{process.name} did not answer on {url} within {timeout:g} s ({last}):\n{process.tail()}"
    )
