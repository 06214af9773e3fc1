"""The sandbox node agent: a stand-in for kubelet and a container runtime.

It is **not a kubelet**. It registers Node objects with the capacity it is given (including
``nvidia.com/gpu``) so the real scheduler places pods, then runs every pod bound to its nodes as
local processes:

* each container's ``command`` + ``args`` run as a process (images are ignored: the command must
  exist on this machine; the project's virtualenv is first on PATH), with ``env`` and ``envFrom``
  resolved — literal values, ``$(VAR)`` expansion, downward-API ``fieldRef`` (``metadata.name``,
  ``metadata.namespace``, ``metadata.uid``, labels/annotations, ``spec.nodeName``,
  ``spec.serviceAccountName``, ``status.podIP``, ``status.hostIP``), ``configMapKeyRef`` and
  ``secretKeyRef``;
* each pod gets its own network namespace and address (see :mod:`tidal.sandbox.podnet`), so
  two pods can listen on the same port and EndpointSlices list real addresses;
* httpGet, tcpSocket and exec probes (startup, readiness, liveness) with their delays, periods,
  timeouts and thresholds; a liveness failure restarts the container;
* pod phase, conditions, container statuses and restarts per ``restartPolicy`` with kubelet's
  exponential back-off;
* on deletion: SIGTERM to the container's process group, SIGKILL after the grace period, then
  the pod object is removed — just as kubelet finalises a deletion;
* a log file per container under ``<state-dir>/pods/<namespace>_<pod>_<uid>/<container>.log``.
* termination messages: the file at a container's own ``terminationMessagePath`` (removed
  before each run, read after it), else with ``FallbackToLogsOnError`` the log's tail of a
  failed run, as kubelet reports them in ``state.terminated.message``.

What it does not do, and how a pod learns it (a waiting reason on the container, never a silent
fake): images and image entrypoints (``CommandRequired``), volume mounts other than the
service-account token, emptyDir and hostPath (``VolumeMountUnsupported``; those two are not
isolated: the process sees the host's filesystem at the mount path), resource limits and
cgroups (not enforced),
``kubectl logs``/``exec``/``port-forward`` (no kubelet API; read the log files), host ports, init
containers (``InitContainersUnsupported``), the in-cluster service-account token file and any
route from a pod to the API server (pods reach only each other and the host's bridge address).

"Fake" nodes (``--fake-nodes``, labelled and tainted ``tidal.dev/sandbox-fake=true``) run nothing:
their pods are reported Running and Ready at once, like kwok, for control-plane scale tests.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .podnet import PodNetwork, enter

log = logging.getLogger("tidal.sandbox.nodeagent")

FAKE_LABEL = "tidal.dev/sandbox-fake"
SA_TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
HOST_IP = "127.0.0.1"
HEARTBEAT_SECONDS = 10.0
BACKOFF_MAX_SECONDS = 300.0
TICK_SECONDS = 0.1

Json = dict[str, Any]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- environment -------------------------------------------------------------------------------
class UnsupportedPod(Exception):
    """The pod asks for something the node agent cannot do; ``reason`` is CamelCase."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ConfigError(Exception):
    """A referenced ConfigMap/Secret key is missing (kubelet: CreateContainerConfigError)."""


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` escapes a dollar."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR_REF.sub(sub, text)


def field_ref(pod: Json, path: str, pod_ip: str) -> str:
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": HOST_IP,
        "status.hostIPs": HOST_IP,
    }
    if path in simple:
        return str(simple[path])
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise UnsupportedPod("FieldRefUnsupported", f"fieldRef {path!r} is not supported")


# -- probes ------------------------------------------------------------------------------------
@dataclass
class ProbeState:
    spec: Json
    next_at: float
    successes: int = 0
    failures: int = 0
    result: bool | None = None  # None: not yet decided

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    def record(self, ok: bool) -> None:
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.result = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.result = False


def run_probe(
    spec: Json,
    pod_ip: str,
    ports: Mapping[str, int],
    env: Mapping[str, str],
    cwd: Path,
    netns: str | None = None,
) -> bool:
    timeout = float(spec.get("timeoutSeconds", 1))

    def port_of(value: Any) -> int:
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return int(value)
        return ports[value]

    try:
        if "httpGet" in spec:
            h = spec["httpGet"]
            scheme = h.get("scheme", "HTTP").lower()
            host = h.get("host") or pod_ip
            url = f"{scheme}://{host}:{port_of(h['port'])}{h.get('path', '/')}"
            req = urllib.request.Request(url)
            for header in h.get("httpHeaders") or []:
                req.add_header(header["name"], header["value"])
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return bool(200 <= resp.status < 400)
        if "tcpSocket" in spec:
            t = spec["tcpSocket"]
            with socket.create_connection(
                (t.get("host") or pod_ip, port_of(t["port"])), timeout=timeout
            ):
                return True
        if "exec" in spec:
            command = list(spec["exec"]["command"])
            done = subprocess.run(
                enter(netns, command) if netns else command,
                env=dict(env),
                cwd=cwd,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            return done.returncode == 0
    except (OSError, urllib.error.URLError, subprocess.TimeoutExpired, KeyError, ValueError):
        return False
    return False


# -- containers --------------------------------------------------------------------------------
@dataclass
class Container:
    spec: Json
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    started_mono: float = 0.0
    restart_count: int = 0
    last_state: Json = field(default_factory=dict)
    terminated: Json | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    backoff_until: float = 0.0
    started_probe: ProbeState | None = None
    ready_probe: ProbeState | None = None
    live_probe: ProbeState | None = None
    env: dict[str, str] = field(default_factory=dict)
    stop_requested: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def started(self) -> bool:
        return self.running() and (self.started_probe is None or self.started_probe.result is True)

    def ready(self) -> bool:
        if not self.started():
            return False
        return self.ready_probe is None or self.ready_probe.result is True

    def signal_group(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def status(self) -> Json:
        state: Json
        if self.running():
            state = {"running": {"startedAt": self.started_at}}
        elif self.waiting is not None:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        out: Json = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "containerID": f"tidal-sandbox://{self.proc.pid}" if self.proc else "",
            "ready": self.ready(),
            "started": self.started(),
            "restartCount": self.restart_count,
            "state": state,
        }
        if self.last_state:
            out["lastState"] = self.last_state
        return out


class PodRunner(threading.Thread):
    """Runs one pod's containers and keeps its status in the API server up to date."""

    def __init__(self, agent: NodeAgent, pod: Json) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.agent = agent
        self.pod = pod
        self.key = (meta["namespace"], meta["name"], meta["uid"])
        self.wake = threading.Event()
        self.gone = False
        self.netns, self.ip = agent.network.attach()
        self.dir = agent.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.containers = [
            Container(spec=c, log_path=self.dir / f"{c['name']}.log")
            for c in pod["spec"].get("containers", [])
        ]
        self.unsupported: UnsupportedPod | None = None
        self.start_time = now_rfc3339()
        self.condition_times: dict[str, tuple[str, str]] = {}
        self.last_status: Json | None = None
        self.shutting_down = False

    # events from the watch
    def update(self, pod: Json) -> None:
        self.pod = pod
        self.wake.set()

    def deleted(self) -> None:
        self.gone = True
        self.wake.set()

    # main loop
    def run(self) -> None:
        try:
            self._check_supported()
        except UnsupportedPod as exc:
            self.unsupported = exc
            for c in self.containers:
                c.waiting = (exc.reason, exc.message)
        while True:
            deleting = self.pod["metadata"].get("deletionTimestamp") is not None
            if self.gone or deleting or self.agent.stopping.is_set():
                self._terminate(deleting and not self.gone)
                return
            if self.unsupported is None:
                for c in self.containers:
                    self._step_container(c)
            self._push_status()
            self.wake.wait(TICK_SECONDS)
            self.wake.clear()

    def _check_supported(self) -> None:
        spec = self.pod["spec"]
        if spec.get("initContainers"):
            raise UnsupportedPod(
                "InitContainersUnsupported",
                "the tidal sandbox node agent does not run init containers",
            )
        for c in self.containers:
            if not c.spec.get("command"):
                raise UnsupportedPod(
                    "CommandRequired",
                    f"container {c.name!r} has no command: the tidal sandbox node agent runs "
                    "containers as local processes and cannot use an image's entrypoint",
                )
            volumes = {v.get("name"): v for v in self.pod["spec"].get("volumes") or []}
            for m in c.spec.get("volumeMounts") or []:
                volume = volumes.get(m.get("name"), {})
                # emptyDir and hostPath mounts pass, not isolated: the process sees the host's
                # own filesystem at mountPath (the runtime's /tmp and engine cache directory).
                if m.get("mountPath") != SA_TOKEN_MOUNT and not (
                    "emptyDir" in volume or "hostPath" in volume
                ):
                    raise UnsupportedPod(
                        "VolumeMountUnsupported",
                        f"container {c.name!r} mounts {m.get('mountPath')!r}: the tidal sandbox "
                        "node agent supports only emptyDir and hostPath volumes, seen at their "
                        "mountPath on the host (pass configuration via env)",
                    )

    # -- containers -------------------------------------------------------------------------
    def _policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy", "Always"))

    def _step_container(self, c: Container) -> None:
        mono = time.monotonic()
        if c.proc is not None and c.proc.poll() is not None:
            self._on_exit(c, mono)
        if c.proc is None or c.proc.poll() is not None:
            if c.terminated is not None and not self._should_restart(c):
                return
            if mono < c.backoff_until:
                return
            self._start(c, mono)
            return
        self._probe(c, mono)

    def _should_restart(self, c: Container) -> bool:
        policy = self._policy()
        if policy == "Always":
            return True
        if policy == "OnFailure":
            return bool(c.terminated and c.terminated.get("exitCode") != 0)
        return False

    def _backoff(self, c: Container) -> float:
        """kubelet's restart back-off: the base doubling per restart, at most 5 minutes."""
        return float(
            min(self.agent.backoff_base * (2 ** min(c.restart_count, 10)), BACKOFF_MAX_SECONDS)
        )

    def _on_exit(self, c: Container, mono: float) -> None:
        assert c.proc is not None
        code = c.proc.returncode
        ran_for = mono - c.started_mono
        reason = "Completed" if code == 0 else "Error"
        if code is not None and code < 0:
            reason = "Error" if not c.stop_requested else "Killed"
        c.terminated = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": reason,
            "startedAt": c.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"tidal-sandbox://{c.proc.pid}",
        }
        message = termination_message(c.spec, c.log_path, c.terminated["exitCode"])
        if message:
            c.terminated["message"] = message
        c.last_state = {"terminated": c.terminated}
        c.proc = None
        c.stop_requested = False
        (self.dir / f"{c.name}.pid").unlink(missing_ok=True)
        c.ready_probe = c.live_probe = c.started_probe = None
        if self._should_restart(c):
            # kubelet: 10 s doubling to 5 min, reset after 10 min of running fine.
            if ran_for > 600:
                c.restart_count = 0
            delay = self._backoff(c)
            c.backoff_until = mono + delay
            c.waiting = (
                "CrashLoopBackOff",
                f"back-off {delay:.0f}s restarting failed container {c.name}: exit code "
                f"{c.terminated['exitCode']}; last log lines: {_tail(c.log_path, 3)}",
            )
        else:
            c.waiting = None

    def _resolve_env(self, c: Container) -> dict[str, str]:
        env: dict[str, str] = {
            "PATH": self.agent.pod_path,
            "HOME": str(Path.home()),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOSTNAME": self.pod["metadata"]["name"],
            "PYTHONUNBUFFERED": "1",
        }
        ns = self.pod["metadata"]["namespace"]
        for src in c.spec.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                data = self.agent.read_config(ns, "configmap", src["configMapRef"]["name"])
            elif "secretRef" in src:
                data = self.agent.read_config(ns, "secret", src["secretRef"]["name"])
            else:
                continue
            if data is None:
                if (src.get("configMapRef") or src.get("secretRef") or {}).get("optional"):
                    continue
                raise ConfigError(f"envFrom source of container {c.name} not found")
            env.update({prefix + k: v for k, v in data.items()})
        for item in c.spec.get("env") or []:
            name = item["name"]
            if "value" in item:
                env[name] = expand(str(item["value"]), env)
                continue
            vf = item.get("valueFrom") or {}
            if "fieldRef" in vf:
                env[name] = field_ref(self.pod, vf["fieldRef"]["fieldPath"], self.ip)
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                kind = "configmap" if "configMapKeyRef" in vf else "secret"
                ref = vf.get("configMapKeyRef") or vf["secretKeyRef"]
                data = self.agent.read_config(ns, kind, ref["name"]) or {}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f"{kind} {ns}/{ref['name']} has no key {ref['key']!r}")
                env[name] = data[ref["key"]]
            elif "resourceFieldRef" in vf:
                res = vf["resourceFieldRef"]["resource"]
                kind, _, rname = res.partition(".")
                env[name] = str((c.spec.get("resources") or {}).get(kind, {}).get(rname, "0"))
            else:
                env[name] = ""
        return env

    def _start(self, c: Container, mono: float) -> None:
        try:
            env = self._resolve_env(c)
        except ConfigError as exc:
            c.waiting = ("CreateContainerConfigError", str(exc))
            c.backoff_until = mono + 1.0
            return
        except UnsupportedPod as exc:
            c.waiting = (exc.reason, exc.message)
            c.backoff_until = mono + 3600.0
            return
        argv = [expand(a, env) for a in [*c.spec["command"], *(c.spec.get("args") or [])]]
        workdir = Path(c.spec.get("workingDir") or self.dir)
        report = _termination_path(c.spec)
        if report is not None:
            report.unlink(missing_ok=True)  # kubelet: each run starts with an empty file
        logf = open(c.log_path, "ab")  # noqa: SIM115 - the child holds it
        try:
            c.proc = subprocess.Popen(
                enter(self.netns, argv),
                env=env,
                cwd=workdir,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            c.terminated = {
                "exitCode": 128,
                "reason": "StartError",
                "message": f"cannot run {argv[0]!r}: {exc.strerror}",
                "startedAt": now_rfc3339(),
                "finishedAt": now_rfc3339(),
            }
            c.last_state = {"terminated": c.terminated}
            delay = self._backoff(c)
            c.backoff_until = mono + delay
            c.waiting = ("RunContainerError", c.terminated["message"])
            c.restart_count += 1
            return
        finally:
            logf.close()
        (self.dir / f"{c.name}.pid").write_text(str(c.proc.pid))
        if c.terminated is not None:
            c.restart_count += 1
        c.env = env
        c.terminated = None
        c.waiting = None
        c.started_at = now_rfc3339()
        c.started_mono = mono

        def probe(key: str) -> ProbeState | None:
            spec = c.spec.get(key)
            if not spec:
                return None
            return ProbeState(spec, next_at=mono + float(spec.get("initialDelaySeconds", 0)))

        c.started_probe = probe("startupProbe")
        c.ready_probe = probe("readinessProbe")
        c.live_probe = probe("livenessProbe")

    def _probe(self, c: Container, mono: float) -> None:
        ports = {
            p["name"]: int(p["containerPort"]) for p in c.spec.get("ports") or [] if p.get("name")
        }

        def due(p: ProbeState | None) -> bool:
            return p is not None and mono >= p.next_at

        def go(p: ProbeState) -> bool:
            ok = run_probe(p.spec, self.ip, ports, c.env, self.dir, self.netns)
            p.record(ok)
            p.next_at = time.monotonic() + p.period
            return ok

        if c.started_probe is not None and c.started_probe.result is not True:
            if due(c.started_probe):
                go(c.started_probe)
                if c.started_probe.result is False:
                    self._kill_for_restart(c, "startup probe failed")
            return
        if due(c.ready_probe):
            assert c.ready_probe is not None
            go(c.ready_probe)
        if due(c.live_probe):
            assert c.live_probe is not None
            go(c.live_probe)
            if c.live_probe.result is False:
                self._kill_for_restart(c, "liveness probe failed")

    def _kill_for_restart(self, c: Container, why: str) -> None:
        log.info("%s/%s: %s, restarting", self.key[1], c.name, why)
        self._stop_container(c, self._grace())

    def _grace(self) -> float:
        meta_grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if meta_grace is not None:
            return float(meta_grace)
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _stop_container(self, c: Container, grace: float) -> None:
        if not c.running():
            return
        assert c.proc is not None
        c.stop_requested = True
        c.signal_group(signal.SIGTERM)
        try:
            c.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            c.signal_group(signal.SIGKILL)
            c.proc.wait(timeout=10)
        c.signal_group(signal.SIGKILL)  # anything the container left behind in its group
        (self.dir / f"{c.name}.pid").unlink(missing_ok=True)

    def _terminate(self, finalize: bool) -> None:
        grace = self._grace()
        if self.agent.stopping.is_set() and not finalize:
            grace = min(grace, 5.0)
        threads = [
            threading.Thread(target=self._stop_container, args=(c, grace), daemon=True)
            for c in self.containers
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if finalize:
            self.agent.finalize_deletion(self.pod)
        self.agent.network.detach(self.netns, self.ip)
        self.agent.forget(self.key)

    # -- status -----------------------------------------------------------------------------
    def _condition(self, ctype: str, ok: bool, reason: str = "", message: str = "") -> Json:
        status = "True" if ok else "False"
        prev = self.condition_times.get(ctype)
        if prev is None or prev[0] != status:
            self.condition_times[ctype] = (status, now_rfc3339())
        # None deletes a stale reason/message under the merge patch.
        return {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self.condition_times[ctype][1],
            "reason": reason or None,
            "message": message or None,
        }

    def _compute_status(self) -> Json:
        statuses = [c.status() for c in self.containers]
        all_ready = bool(self.containers) and all(c.ready() for c in self.containers)
        any_running = any(c.running() for c in self.containers)
        policy = self._policy()
        phase = "Pending"
        if any_running:
            phase = "Running"
        elif self.containers and all(c.terminated is not None for c in self.containers):
            codes = [c.terminated["exitCode"] for c in self.containers if c.terminated]
            if policy == "Never" or (policy == "OnFailure" and all(x == 0 for x in codes)):
                phase = "Succeeded" if all(x == 0 for x in codes) else "Failed"
            elif any(c.restart_count > 0 or c.waiting for c in self.containers):
                phase = "Running"
        not_ready = [c.name for c in self.containers if not c.ready()]
        why = "" if all_ready else "ContainersNotReady"
        msg = "" if all_ready else f"containers with unready status: [{' '.join(not_ready)}]"
        status: Json = {
            "phase": phase,
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodReadyToStartContainers", True),
                self._condition("Initialized", True),
                self._condition("Ready", all_ready, why, msg),
                self._condition("ContainersReady", all_ready, why, msg),
                self._condition("PodScheduled", True),
            ],
            "containerStatuses": statuses,
        }
        if self.unsupported is not None:
            status["reason"] = self.unsupported.reason
            status["message"] = self.unsupported.message
        return status

    def _push_status(self) -> None:
        status = self._compute_status()
        if status == self.last_status:
            return
        ns, name, _uid = self.key
        try:
            self.agent.patch_pod_status(ns, name, status)
            self.last_status = status
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                self.gone = True
            else:
                log.warning("status update of %s/%s failed: %s", ns, name, exc)


TERMINATION_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048


def _termination_path(spec: Mapping[str, Any]) -> Path | None:
    """A container's own ``terminationMessagePath``; the default ``/dev/termination-log`` (and
    anything under /dev) is not read here: pods share the host's filesystem."""
    path = spec.get("terminationMessagePath")
    if not path or str(path).startswith("/dev/"):
        return None
    return Path(str(path))


def termination_message(spec: Mapping[str, Any], log_path: Path, exit_code: int) -> str:
    """kubelet's termination message: the file at ``terminationMessagePath`` (at most 4096
    bytes); when it is empty, the container failed and its policy is
    ``FallbackToLogsOnError``, the log's last 80 lines (at most 2048 bytes)."""
    path = _termination_path(spec)
    if path is not None:
        try:
            with path.open("rb") as f:
                text = f.read(TERMINATION_MESSAGE_BYTES).decode(errors="replace")
        except OSError:
            text = ""
        if text:
            return text
    if exit_code == 0 or spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return ""
    try:
        lines = log_path.read_bytes().splitlines()[-FALLBACK_LOG_LINES:]
    except OSError:
        return ""
    return b"\n".join(lines)[-FALLBACK_LOG_BYTES:].decode(errors="replace")


def _tail(path: Path, lines: int) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- the agent ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeSpec:
    name: str
    capacity: dict[str, str]
    fake: bool = False


class NodeAgent:
    """Registers nodes, watches the pods bound to them and runs those pods."""

    def __init__(
        self,
        api_client: Any,
        nodes: list[NodeSpec],
        state_dir: Path,
        pod_path: str,
        backoff_base: float = 10.0,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.nodes = {n.name: n for n in nodes}
        self.state_dir = state_dir
        self.pod_path = pod_path
        self.backoff_base = backoff_base
        self.network = PodNetwork()
        self.stopping = threading.Event()
        self.runners: dict[tuple[str, str, str], PodRunner] = {}
        self.fake_pods: dict[tuple[str, str, str], str] = {}
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-pods")

    # -- API helpers --------------------------------------------------------------------------
    def read_config(self, namespace: str, kind: str, name: str) -> dict[str, str] | None:
        import base64

        try:
            if kind == "configmap":
                return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
            secret = self.core.read_namespaced_secret(name, namespace)
            return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise

    def patch_pod_status(self, namespace: str, name: str, status: Json) -> None:
        self.core.patch_namespaced_pod_status(name, namespace, {"status": status})

    def finalize_deletion(self, pod: Json) -> None:
        from kubernetes import client

        meta = pod["metadata"]
        with contextlib.suppress(Exception):
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=meta["uid"]),
                ),
            )

    def forget(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            self.runners.pop(key, None)

    # -- nodes --------------------------------------------------------------------------------
    def _node_status(self, spec: NodeSpec) -> Json:
        ts = now_rfc3339()

        def cond(ctype: str, status: str, reason: str, message: str) -> Json:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": ts,
                "lastTransitionTime": self._started_at,
            }

        return {
            "capacity": spec.capacity,
            "allocatable": spec.capacity,
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": spec.name},
            ],
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "sandbox node"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "sandbox node"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "sandbox node"),
                cond("Ready", "True", "KubeletReady", "tidal sandbox node agent is posting status"),
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "tidal-sandbox://0.1",
                "kernelVersion": os.uname().release,
                "kubeProxyVersion": "",
                "kubeletVersion": os.environ.get("TIDAL_K8S_VERSION", "v1.37.2"),
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": "tidal sandbox node agent (not a kubelet)",
                "systemUUID": "",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        }

    def register_nodes(self) -> None:
        self._started_at = now_rfc3339()
        for spec in self.nodes.values():
            labels = {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "tidal.dev/sandbox": "true",
            }
            taints: list[Json] = []
            if spec.fake:
                labels[FAKE_LABEL] = "true"
                taints.append({"key": FAKE_LABEL, "value": "true", "effect": "NoSchedule"})
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": spec.name, "labels": labels},
                "spec": {"taints": taints} if taints else {},
            }
            try:
                self.core.create_node(body)
            except Exception as exc:
                if getattr(exc, "status", None) != 409:
                    raise
            self.core.patch_node_status(spec.name, {"status": self._node_status(spec)})

    def heartbeat_forever(self) -> None:
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            for spec in self.nodes.values():
                try:
                    self.core.patch_node_status(spec.name, {"status": self._node_status(spec)})
                    self._renew_lease(spec.name)
                except Exception as exc:
                    log.warning("heartbeat for %s failed: %s", spec.name, exc)

    def _renew_lease(self, node: str) -> None:
        ts = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": ts},
        }
        try:
            self.coordination.patch_namespaced_lease(node, "kube-node-lease", body)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                self.coordination.create_namespaced_lease("kube-node-lease", body)
            else:
                raise

    # -- pods ---------------------------------------------------------------------------------
    def handle(self, event_type: str, pod: Json) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node not in self.nodes:
            return
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"], meta["uid"])
        if self.nodes[node].fake:
            self._handle_fake(event_type, key, pod)
            return
        with self.lock:
            runner = self.runners.get(key)
            if event_type == "DELETED":
                if runner is not None:
                    runner.deleted()
                return
            if runner is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    if meta.get("deletionTimestamp"):
                        self.pool.submit(self.finalize_deletion, pod)
                    return
                runner = PodRunner(self, pod)
                self.runners[key] = runner
                runner.start()
            else:
                runner.update(pod)

    def _handle_fake(self, event_type: str, key: tuple[str, str, str], pod: Json) -> None:
        with self.lock:
            if event_type == "DELETED":
                ip = self.fake_pods.pop(key, None)
                if ip:
                    self.network.release_address(ip)
                return
            if pod["metadata"].get("deletionTimestamp"):
                self.pool.submit(self.finalize_deletion, pod)
                return
            if key in self.fake_pods:
                return
            ip = self.fake_pods[key] = self.network.address_only()
        ts = now_rfc3339()

        def cond(ctype: str) -> Json:
            return {"type": ctype, "status": "True", "lastTransitionTime": ts}

        status = {
            "phase": "Running",
            "hostIP": HOST_IP,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": ts,
            "conditions": [
                cond(t) for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": ts}},
                }
                for c in pod["spec"].get("containers", [])
            ],
        }
        ns, name, _ = key
        self.pool.submit(_quietly, self.patch_pod_status, ns, name, status)

    def watch_forever(self) -> None:
        from kubernetes import watch

        rv: str | None = None
        while not self.stopping.is_set():
            try:
                if rv is None:
                    listing = self.core.list_pod_for_all_namespaces(
                        field_selector="spec.nodeName!=", _preload_content=False
                    )
                    doc = json.loads(listing.data)
                    for pod in doc["items"]:
                        self.handle("ADDED", pod)
                    rv = doc["metadata"]["resourceVersion"]
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=rv,
                    timeout_seconds=60,
                ):
                    if self.stopping.is_set():
                        w.stop()
                        break
                    raw = ev["raw_object"]
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    rv = raw["metadata"]["resourceVersion"]
                    self.handle(ev["type"], raw)
            except Exception as exc:
                if self.stopping.is_set():
                    break
                if getattr(exc, "status", None) == 410:
                    rv = None
                else:
                    log.warning("pod watch broke (%s); resuming", exc)
                    time.sleep(0.5)

    def run(self) -> None:
        self.network.setup()
        log.info("pod network %s on bridge tidal%d", self.network.subnet, self.network.index)
        self.register_nodes()
        for name in self.nodes:
            with contextlib.suppress(Exception):
                self._renew_lease(name)
        threading.Thread(target=self.heartbeat_forever, daemon=True, name="heartbeat").start()
        watcher = threading.Thread(target=self.watch_forever, daemon=True, name="watch")
        watcher.start()
        self.stopping.wait()
        with self.lock:
            runners = list(self.runners.values())
        for r in runners:
            r.wake.set()
        for r in runners:
            r.join(timeout=30)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.network.teardown()


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:
        log.warning("%s failed: %s", getattr(fn, "__name__", fn), exc)


def kill_leftovers(state_dir: Path) -> int:
    """Kill pod process groups recorded under ``state_dir`` (after an agent crash); count them."""
    killed = 0
    for pid_file in (state_dir / "pods").glob("*/*.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            killed += 1
    return killed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tidal-sandbox-nodeagent", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", type=int, default=2)
    p.add_argument("--cpu-per-node", default="16")
    p.add_argument("--memory-per-node", default="64Gi")
    p.add_argument("--pods-per-node", type=int, default=110)
    p.add_argument("--fake-nodes", type=int, default=0)
    p.add_argument("--fake-node-pods", type=int, default=1000)
    p.add_argument("--pod-path", default=os.environ.get("PATH", ""))
    p.add_argument("--restart-backoff", type=float, default=10.0, help="first restart delay (s)")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s"
    )
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = 64
    api = client.ApiClient(configuration)

    def capacity(pods: int) -> dict[str, str]:
        return {
            "cpu": args.cpu_per_node,
            "memory": args.memory_per_node,
            "pods": str(pods),
            "nvidia.com/gpu": str(args.gpus_per_node),
            "ephemeral-storage": "100Gi",
        }

    nodes = [
        NodeSpec(f"tidal-node-{i + 1}", capacity(args.pods_per_node)) for i in range(args.nodes)
    ]
    nodes += [
        NodeSpec(f"tidal-fake-node-{i + 1}", capacity(args.fake_node_pods), fake=True)
        for i in range(args.fake_nodes)
    ]
    path = os.pathsep.join(x for x in [args.pod_path, os.environ.get("PATH", "")] if x)
    agent = NodeAgent(api, nodes, args.state_dir, path, args.restart_backoff)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping pods and exiting", signum)
        agent.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("node agent up: %s", ", ".join(nodes_ for nodes_ in agent.nodes))
    agent.run()
    kill_leftovers(args.state_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
