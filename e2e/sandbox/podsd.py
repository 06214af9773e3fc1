"""Pod discovery for the sandbox's Prometheus, through the sandbox API server.

Debian's Prometheus is built without Kubernetes service discovery, so this small bridge watches
pods through the API server and keeps a ``file_sd`` targets file up to date (Prometheus notices
the change through inotify). It applies the conventional annotations —
``prometheus.io/scrape: "true"``, ``prometheus.io/port``, ``prometheus.io/path`` — and turns pod
labels ``serving.tidal.dev/{isvc,pool,role}`` into the series labels ``isvc``, ``pool``, ``role``,
like a ``kubernetes_sd_configs`` relabelling would on a real cluster.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("tidal.sandbox.podsd")

LABELS = {
    "serving.tidal.dev/isvc": "isvc",
    "serving.tidal.dev/pool": "pool",
    "serving.tidal.dev/role": "role",
}


def target_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The file_sd entry for a pod, or None when it is not to be scraped (yet)."""
    meta = pod.get("metadata", {})
    ann = meta.get("annotations") or {}
    status = pod.get("status") or {}
    if ann.get("prometheus.io/scrape") != "true" or meta.get("deletionTimestamp"):
        return None
    if status.get("phase") != "Running" or not status.get("podIP"):
        return None
    port = ann.get("prometheus.io/port", "80")
    labels = {
        "namespace": meta.get("namespace", ""),
        "pod": meta.get("name", ""),
        "__metrics_path__": ann.get("prometheus.io/path", "/metrics"),
    }
    for key, name in LABELS.items():
        if key in (meta.get("labels") or {}):
            labels[name] = meta["labels"][key]
    return {"targets": [f"{status['podIP']}:{port}"], "labels": labels}


class TargetsWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pods: dict[str, dict[str, Any]] = {}
        self.last: str | None = None

    def apply(self, event: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        target = None if event == "DELETED" else target_of(pod)
        if target is None:
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = target

    def flush(self) -> None:
        text = json.dumps(sorted(self.pods.values(), key=lambda t: t["targets"][0]), indent=1)
        if text == self.last:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.path)  # atomic: Prometheus never reads half a file
        self.last = text


def run(kubeconfig: str, out: Path, stop: threading.Event) -> None:
    from kubernetes import client, config, watch

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    core = client.CoreV1Api(client.ApiClient(configuration))
    writer = TargetsWriter(out)
    writer.flush()
    while not stop.is_set():
        try:
            listing = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
            writer.pods.clear()
            for pod in listing["items"]:
                writer.apply("ADDED", pod)
            writer.flush()
            rv = listing["metadata"]["resourceVersion"]
            w = watch.Watch()
            for ev in w.stream(
                core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=60
            ):
                if stop.is_set() or ev["type"] == "ERROR":
                    w.stop()
                    break
                writer.apply(ev["type"], ev["raw_object"])
                writer.flush()
        except Exception as exc:
            if not stop.is_set():
                log.warning("pod watch broke (%s); relisting", exc)
                time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tidal-sandbox-podsd", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=run, args=(args.kubeconfig, args.out, stop), daemon=True).start()
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
