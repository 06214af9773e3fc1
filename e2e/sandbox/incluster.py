"""Workloads the end-to-end scenarios run *inside* a real-node cluster, as a user's would: a model
store that serves engine files over HTTP, and a client pod that sends Open Inference Protocol
requests to a Service by its DNS name (so through CoreDNS and kube-proxy) and prints a JSON
summary as its last log line.

The client's script uses only Python's standard library and runs from the runtime image.
"""

from __future__ import annotations

import json
from typing import Any

# A client: `rate` requests a second for `seconds` to `url` with `body`. A refused or reset
# connection is retried for up to 5 s (0.25 s apart), as client libraries' connect-failure
# retries do: an endpoint that went away stays in kube-proxy's rules until kubelet reports it,
# and a retry may land on it again. Every other failure counts. It prints one summary line:
# {"codes": {...}, "failed": [...], "retried": n, ...}.
CLIENT_SCRIPT = r"""
import json, sys, time, threading, urllib.request, urllib.error, http.client
url, rate, seconds, body = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].encode()
codes, failed, per_second, lock = {}, [], {}, threading.Lock()
latencies, retried = [], [0]
def one(i):
    t0 = time.monotonic()
    while True:
        try:
            headers = {"Content-Type": "application/json"}
            req = urllib.request.Request(url, data=body, headers=headers)
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read(); code = r.status
            break
        except urllib.error.HTTPError as e:
            code = e.code; break
        except (urllib.error.URLError, ConnectionError, http.client.HTTPException, OSError) as e:
            code = f"conn:{type(getattr(e, 'reason', e)).__name__}"
            if time.monotonic() - t0 > 5.0: break
            with lock: retried[0] += 1
            time.sleep(0.25)
    dt = time.monotonic() - t0
    with lock:
        codes[str(code)] = codes.get(str(code), 0) + 1
        sec = int(t_start_offset + (t0 - start))
        per_second.setdefault(sec, {}).setdefault(str(code), 0)
        per_second[sec][str(code)] += 1
        if code != 200: failed.append([round(t0 - start, 2), str(code)])
        else: latencies.append(dt)
start = time.monotonic(); t_start_offset = 0
threads = []
n = int(rate * seconds)
for i in range(n):
    target = start + i / rate
    delay = target - time.monotonic()
    if delay > 0: time.sleep(delay)
    t = threading.Thread(target=one, args=(i,)); t.start(); threads.append(t)
for t in threads: t.join()
latencies.sort()
def p(q):
    if not latencies: return None
    return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1)
print(json.dumps({"sent": n, "codes": codes, "failed": failed[:50], "retried": retried[0],
                  "p50_ms": p(0.5), "p99_ms": p(0.99),
                  "per_second": {str(k): v for k, v in sorted(per_second.items())}}), flush=True)
"""

SECURE_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
SECURE_POD = {
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "runAsGroup": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def client_pod(
    name: str, image: str, url: str, body: dict[str, Any], *, rate: float, seconds: float
) -> dict[str, Any]:
    """A pod that runs :data:`CLIENT_SCRIPT` once against ``url``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "journey-client"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": SECURE_POD,
            "containers": [
                {
                    "name": "client",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", CLIENT_SCRIPT],
                    "args": [url, str(rate), str(seconds), json.dumps(body)],
                    "securityContext": SECURE_CONTAINER,
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                }
            ],
        },
    }


def command_pod(name: str, image: str, command: list[str]) -> dict[str, Any]:
    """A pod that runs one command as the images' non-root user on a read-only root."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": SECURE_POD,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": SECURE_CONTAINER,
                }
            ],
        },
    }


def model_store(
    image: str, host_dir: str, port: int = 8000, service_port: int | None = None
) -> list[dict[str, Any]]:
    """``models``: a Deployment serving ``host_dir`` of the node read-only over HTTP (Python's
    http.server, which logs every GET: the scenarios count downloads from its log), and its
    Service (on ``service_port``, default ``port``; 80 for the examples' URLs)."""
    labels = {"app": "models"}
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "models", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "securityContext": SECURE_POD,
                        "containers": [
                            {
                                "name": "http",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "command": [
                                    "python",
                                    "-u",
                                    "-m",
                                    "http.server",
                                    str(port),
                                    "--directory",
                                    "/models",
                                ],
                                "ports": [{"containerPort": port, "name": "http"}],
                                "readinessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 1},
                                "securityContext": SECURE_CONTAINER,
                                "volumeMounts": [
                                    {"name": "models", "mountPath": "/models", "readOnly": True}
                                ],
                                "resources": {"requests": {"cpu": "20m", "memory": "48Mi"}},
                            }
                        ],
                        "volumes": [
                            {"name": "models", "hostPath": {"path": host_dir, "type": "Directory"}}
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "models"},
            "spec": {
                "selector": labels,
                "ports": [{"name": "http", "port": service_port or port, "targetPort": "http"}],
            },
        },
    ]


def last_json_line(log: str) -> dict[str, Any]:
    """The last line of ``log`` that parses as a JSON object."""
    for line in reversed(log.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    raise ValueError(f"no JSON summary in the log:\n{log[-2000:]}")
