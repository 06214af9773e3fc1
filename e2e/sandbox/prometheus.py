"""Prometheus configuration for the sandbox.

Targets come from ``file_sd`` kept current by :mod:`tidal.sandbox.podsd`, which discovers pods
through the sandbox API server (Debian's Prometheus has no Kubernetes discovery built in). Every
target carries ``namespace``, ``pod`` and — for tidal pods — ``isvc``, ``pool`` and ``role``.
"""

from __future__ import annotations

from pathlib import Path

import yaml


def write_prometheus_config(path: Path, *, targets_file: Path, scrape_interval: str = "1s") -> Path:
    doc = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
