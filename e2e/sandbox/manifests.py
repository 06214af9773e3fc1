"""Small manifests used by the foundation demo and the sandbox tests."""

from __future__ import annotations

import sys
from typing import Any


def echo_deployment(
    name: str, replicas: int = 2, *, ready: bool = True, gpus: int = 0, grace: int = 5
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "echo",
        "image": "tidal.dev/echo:sandbox",
        "command": [sys.executable, "-m", "tidal.sandbox.echo"],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "PORT", "value": "8080"},
            {"name": "ECHO_READY", "value": "true" if ready else "false"},
        ],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 5},
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "8080",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {"terminationGracePeriodSeconds": grace, "containers": [container]},
            },
        },
    }


def service(name: str, port: int = 8080) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }
