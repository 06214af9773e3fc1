"""End to end: a new model version from the object store to all traffic (issue 32), on the real
node.

A user keeps the source model and its data sets in an S3 bucket (the sandbox's versitygw) and
the store's keys in a Secret. They commit ModelBuilds: the operator runs each build as a Job on
the real kubelet with the runtime image, the builder makes an FP32 and an INT8 engine, gates
each against the FP32 source on the held-out digits, and publishes what passed to the store.

1. ``digits-1`` (a representative calibration set) passes its gate; ``digits-2`` (64 blank
   images as its calibration set) has its INT8 engine refused, with the gate's numbers.
2. A service serves ``digits-1`` INT8, beside a baseline pool pinned to ``digits-1`` FP32.
3. Under steady traffic the user applies a new version: ModelBuild ``digits-3`` and the
   service's primary pointed at it. The Job is scheduled, builds, gates and publishes; the
   staged rollout starts by itself, takes its 50 % step and ends with all traffic on
   ``digits-3``.
4. The user points the primary at the refused ``digits-2``: the service is ``Degraded``
   (``BuildNotServable``), keeps serving ``digits-3``, and the refused engine never reaches a
   pod: no runtime configuration of any pool ever names it (watched throughout), and the store
   holds only its refusal record.

Asserted: no request failed during the whole journey; each step above; and, from the answers
themselves (every OIP answer carries the ``model_version`` that served it): only version 1
before, both 1 and 3 during the 50 % step, only 3 once all traffic moved, never the refused 2;
the gate's threshold on every engine of both builds (FP32 and INT8 of digits-1 pass, FP32 of
digits-2 passes, its INT8 is refused below the limit). Printed: the journey's table (seconds
per phase, from the build pod's own progress lines and the API's timestamps), the gate's
numbers, the answers by version per phase and the 50 % step's measured split.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from scenario import apply, install_crd, parse_time, running_operator

from tidal.runtime.builder.spec import GateSpec
from tidal.runtime.modelgen import write_digits_build_inputs
from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.realnode, pytest.mark.timeout(900)]

GROUP, VERSION = "serving.tidal.dev", "v1alpha1"
SOURCES, ENGINES, SECRET = "models", "engines", "model-store"
NAME = "digits"
RPS = 10.0
# A build Job imports onnxruntime, quantizes and gates on a loaded 2-core machine: be generous.
BUILD_TIMEOUT = 420.0
DIGITS_BODY = {
    "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [4.0] * 64}]
}


def build_manifest(
    name: str, version: str, namespace: str, endpoint: str, calibration: str
) -> dict[str, Any]:
    """A ModelBuild as a user commits it: everything in the store, the keys in a Secret."""
    src = f"s3://{SOURCES}/{namespace}/digits"
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelBuild",
        "metadata": {"name": name},
        "spec": {
            "model": "digits",
            "version": version,
            "source": {"uri": f"{src}/digits.onnx"},
            "precisions": ["fp32", "int8"],
            "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
            "calibration": {"uri": f"{src}/{calibration}"},
            "validation": {"uri": f"{src}/validation.npz", "labels": "labels"},
            "output": f"s3://{ENGINES}/{namespace}",
            "s3": {"endpoint": endpoint, "credentialsSecret": SECRET},
        },
    }


def build_ref(build: str, precision: str) -> dict[str, Any]:
    return {
        "name": "digits",
        "build": {"name": build, "precision": precision},
        "maxBatchSize": 8,
        "warmup": {"batchSizes": [1], "iterations": 1},
    }


def service_manifest(endpoint: str) -> dict[str, Any]:
    runtime = {
        "backend": "onnxruntime",
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "storage": {"s3": {"endpoint": endpoint, "credentialsSecret": SECRET}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": NAME},
        "spec": {
            "runtime": runtime,
            "models": [build_ref("digits-1", "int8")],
            "autoscaling": {"minReplicas": 1, "maxReplicas": 1, "standbyReplicas": 0},
            "rollout": {
                # the validated version, pinned: the baseline does not follow the primary
                "baseline": {"minReplicas": 1, "models": [build_ref("digits-1", "fp32")]},
                "steps": [50, 100],
                "stepSeconds": 15,
                "drainSeconds": 5,
            },
        },
    }


class Journey:
    """The API as the journey reads it."""

    def __init__(self, sandbox: Any, namespace: str) -> None:
        self.sandbox, self.namespace = sandbox, namespace
        self.custom = client.CustomObjectsApi(sandbox.api_client())
        self.core = client.CoreV1Api(sandbox.api_client())

    def build(self, name: str) -> dict[str, Any]:
        return dict(
            self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "modelbuilds", name
            )
        )

    def build_reason(self, name: str) -> str:
        try:
            return str(condition(self.build(name), "Ready").get("reason", ""))
        except ApiException:
            return ""

    def wait_build(self, name: str, reason: str) -> dict[str, Any]:
        return wait_for(
            lambda: self.build_reason(name) == reason and self.build(name),
            timeout=BUILD_TIMEOUT,
            interval=0.5,
            what=f"ModelBuild {name} Ready reason {reason}",
            describe=lambda: (
                json.dumps(self.build(name).get("status"))[:3000] + f"\npods: {self.pod_phases()}"
            ),
        )

    def pod_phases(self) -> list[tuple[str, str]]:
        return [
            (p.metadata.name, p.status.phase)
            for p in self.core.list_namespaced_pod(self.namespace).items
        ]

    def isvc(self) -> dict[str, Any]:
        return get_isvc(self.sandbox, self.namespace, NAME)

    def wait_isvc(self, holds: Any, what: str, timeout: float = 300.0) -> dict[str, Any]:
        return wait_for(
            lambda: (b := self.isvc()) and holds(b) and b,
            timeout=timeout,
            interval=0.25,
            what=what,
            describe=lambda: json.dumps(self.isvc().get("status"))[:4000],
        )

    def point_at(self, build: str, precision: str) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "inferenceservices",
            NAME,
            {"spec": {"models": [build_ref(build, precision)]}},
        )

    def configs(self) -> dict[str, str]:
        """Every runtime configuration of the namespace (ConfigMap name -> its data)."""
        return {
            cm.metadata.name: json.dumps(cm.data or {})
            for cm in self.core.list_namespaced_config_map(self.namespace).items
            if cm.metadata.name.endswith("-config")
        }

    def job_log(self, build: str) -> tuple[str, float]:
        """The build pod's log and the wall time it was scheduled."""
        job = self.build(build)["status"]["targets"][0]["job"]
        (pod,) = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"job-name={job}"
        ).items
        scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
        log = self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace)
        return str(log), scheduled.last_transition_time.timestamp()


class ConfigWatch:
    """Polls every pool's runtime configuration in a thread, recording any that names
    ``needle`` (the refused engine must never reach a pod)."""

    def __init__(self, journey: Journey, needle: str) -> None:
        self.journey, self.needle = journey, needle
        self.seen: list[tuple[str, str]] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="config-watch")

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                configs = self.journey.configs()
            except Exception:  # a hiccup of the API server: poll again
                continue
            self.polls += 1
            self.seen += [(n, d[:300]) for n, d in configs.items() if self.needle in d]

    def __enter__(self) -> ConfigWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def progress_times(log: str) -> dict[str, float]:
    """``{"built: int8": wall time, ...}`` from the builder's progress lines."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        stamp, _, what = line.partition(" ")
        if stamp[:4].isdigit() and ":" in what:
            out.setdefault(what.strip(), parse_time(stamp))
    return out


def test_a_new_version_from_the_store_is_built_gated_and_rolled_out_under_traffic(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    store, endpoint = sandbox.objects, sandbox.objects_url
    assert store is not None and endpoint, "the real node's sandbox runs an object store"
    install_crd(sandbox)
    inputs = write_digits_build_inputs(tmp_path / "digits")
    store.create_bucket(SOURCES)
    store.create_bucket(ENGINES)
    for name in ("digits.onnx", "calibration.npz", "blank.npz", "validation.npz"):
        store.put_file(SOURCES, f"{namespace}/digits/{name}", inputs / name)
    sandbox.kubectl(
        "create",
        "secret",
        "generic",
        SECRET,
        "-n",
        namespace,
        *(f"--from-literal={k}={v}" for k, v in store.env().items()),
    )
    journey = Journey(sandbox, namespace)
    refused_engine = f"/{namespace}/digits/2/cpu/int8/"
    with (
        running_operator(sandbox, namespace, tmp_path / "operator.log"),
        ConfigWatch(journey, refused_engine) as watch,
    ):
        # 1. one build passes its gate, one is refused
        apply(
            sandbox,
            namespace,
            build_manifest("digits-1", "1", namespace, endpoint, "calibration.npz"),
        )
        apply(sandbox, namespace, build_manifest("digits-2", "2", namespace, endpoint, "blank.npz"))
        passed = journey.wait_build("digits-1", "Built")
        refused = journey.wait_build("digits-2", "GateRefused")

        # 2. the service on digits-1, a baseline pinned to it
        apply(sandbox, namespace, service_manifest(endpoint))
        journey.wait_isvc(
            lambda b: (
                condition(b, "Ready").get("status") == "True"
                and (b["status"].get("rollout") or {}).get("phase") == "Stable"
            ),
            "the service Ready and Stable on digits-1",
        )

        # 3. under traffic: a new version, built, gated, published and rolled out
        marks: dict[str, float] = {}
        errors: list[BaseException] = []
        done = threading.Event()

        def drive() -> None:
            try:
                time.sleep(3.0)  # traffic first: the load's own start is not part of the journey
                marks["applied"] = time.time()
                apply(
                    sandbox,
                    namespace,
                    build_manifest("digits-3", "3", namespace, endpoint, "calibration.npz"),
                )
                journey.point_at("digits-3", "int8")
                journey.wait_build("digits-3", "Built")
                marks["status Built"] = time.time()
                journey.wait_isvc(
                    lambda b: (
                        (b["status"].get("rollout") or {}).get("phase")
                        in ("Preparing", "Progressing")
                    ),
                    "the staged rollout of digits-3 to start",
                )
                marks["rollout started"] = time.time()
                journey.wait_isvc(
                    lambda b: (
                        0 < (b["status"].get("rollout") or {}).get("primaryTrafficPercent", 0) < 100
                    ),
                    "the rollout's 50 % step",
                )
                marks["rollout step"] = time.time()
                journey.wait_isvc(
                    lambda b: (
                        (b["status"].get("rollout") or {}).get("primaryTrafficPercent", 0) >= 100
                        or (b["status"].get("rollout") or {}).get("phase") == "Stable"
                    ),
                    "the rollout's 100 % step",
                )
                marks["rollout 100 %"] = time.time()
                journey.wait_isvc(
                    lambda b: (
                        (b["status"].get("rollout") or {}).get("phase") == "Stable"
                        and {(x["pool"], x["build"]) for x in b["status"].get("builds") or []}
                        == {("primary", "digits-3"), ("baseline", "digits-1")}
                    ),
                    "all traffic on digits-3",
                )
                marks["all traffic"] = time.time()
                # 4. the refused version named: Degraded, still serving digits-3
                journey.point_at("digits-2", "int8")
                journey.wait_isvc(
                    lambda b: condition(b, "Degraded").get("reason") == "BuildNotServable",
                    "Degraded naming the refused build",
                    timeout=120,
                )
                marks["refused named"] = time.time()
                time.sleep(10.0)  # traffic on, while the operator would have acted on it
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)
            finally:
                done.set()

        driver = threading.Thread(target=drive, daemon=True, name="journey")
        load = LoadGenerator(
            sandbox.api_client(), namespace, NAME, "digits", DIGITS_BODY, lambda t: RPS
        )
        driver.start()
        report = asyncio.run(load.run_until(lambda t: done.is_set() or t > 780))
        driver.join(timeout=5)
        if errors:
            raise errors[0]
        final = journey.isvc()
        configs = journey.configs()
        pods = [
            (
                p.metadata.name,
                (p.metadata.labels or {}).get("serving.tidal.dev/pool"),
                p.status.pod_ip,
            )
            for p in journey.core.list_namespaced_pod(namespace).items
        ]
        log3, scheduled3 = journey.job_log("digits-3")

    failures = report.failures()
    story = f"marks: {marks}\nstatus: {json.dumps(final.get('status'))[:3000]}"
    assert report.samples, "no traffic was sent"
    assert not failures, f"{len(failures)} of {len(report.samples)} failed: {failures[:5]}\n{story}"
    degraded = condition(final, "Degraded")
    assert degraded["reason"] == "BuildNotServable", story
    assert "digits-2" in degraded["message"] and "int8" in degraded["message"], degraded
    assert condition(final, "Ready")["status"] == "True", story
    assert {(b["pool"], b["build"]) for b in final["status"]["builds"]} == {
        ("primary", "digits-3"),
        ("baseline", "digits-1"),
    }, story
    # the refused engine never reached a pod, and only its refusal is in the store
    assert watch.polls > 20 and not watch.seen, (watch.polls, watch.seen[:3])
    assert not any(refused_engine in text for text in configs.values()), configs
    refused_dir = store.data_dir / ENGINES / namespace / "digits" / "2" / "cpu" / "int8"
    assert sorted(p.name for p in refused_dir.iterdir()) == ["manifest.json"], list(
        refused_dir.iterdir()
    )
    refused_int8 = next(
        a for a in refused["status"]["targets"][0]["artifacts"] if a["precision"] == "int8"
    )
    passed_int8 = next(
        a for a in passed["status"]["targets"][0]["artifacts"] if a["precision"] == "int8"
    )
    assert not refused_int8["published"] and refused_int8.get("uri") is None, refused_int8
    assert passed_int8["published"], passed_int8

    # the rollout proven by the answers: the version that served each one (OIP model_version)
    answers = [x for x in report.samples if x.ok]
    unversioned = [x for x in answers if not x.version]
    assert not unversioned, f"{len(unversioned)} answers without model_version: {unversioned[:3]}"

    def served(start: float, end: float = float("inf")) -> Counter[str]:
        return Counter(x.version for x in answers if start <= x.wall < end)

    split = {
        "before": served(0.0, marks["applied"]),
        "50 % step": served(marks["rollout step"], marks["rollout 100 %"]),
        "after": served(marks["all traffic"]),
    }
    every = served(0.0)
    late = Counter((x.endpoint, x.version) for x in answers if x.wall >= marks["all traffic"])
    t_mono = report.samples[0].sent - (report.samples[0].wall - marks["applied"])
    changes = [(round(t - t_mono, 1), eps) for t, eps in report.endpoint_changes]
    story = (
        f"answers by version {dict(every)}, by phase {split}\nafter all traffic, by (endpoint, "
        f"version): {dict(late)}\nendpoint changes (s after applied): {changes}\npods: {pods}"
        f"\n{story}"
    )
    assert "2" not in every, f"an answer came from the refused version: {story}"
    assert set(split["before"]) == {"1"}, story
    assert set(split["50 % step"]) == {"1", "3"}, f"both versions serve the 50 % step: {story}"
    assert set(split["after"]) == {"3"}, f"only the new version once all traffic moved: {story}"
    step = split["50 % step"]
    share = step["3"] / sum(step.values())

    # the gate's thresholds, on both builds: FP32 passes both; INT8 passes on representative
    # calibration and is refused on blank images, each against the gate's limit
    limit = GateSpec().min_top1_agreement
    gates: dict[str, dict[str, Any]] = {}
    for build in (passed, refused):
        for artifact in build["status"]["targets"][0]["artifacts"]:
            gates[f"{build['metadata']['name']} {artifact['precision']}"] = artifact
    assert sorted(gates) == ["digits-1 fp32", "digits-1 int8", "digits-2 fp32", "digits-2 int8"]
    for name, artifact in gates.items():
        admitted = name != "digits-2 int8"
        agreement = artifact.get("top1Agreement")
        assert agreement is not None, (name, artifact)
        assert artifact["published"] is admitted and (agreement >= limit) is admitted, (
            name,
            limit,
            artifact,
        )
        assert f"minTop1Agreement {limit:g}" in artifact["reason"], (name, artifact)

    # the journey's table
    phases = progress_times(log3)
    t0 = marks["applied"]
    rows = [
        ("Job scheduled", scheduled3),
        ("inputs fetched", phases.get("fetched: inputs")),
        ("int8 built", phases.get("built: int8")),
        ("int8 gated", phases.get("gated: int8 passed")),
        ("int8 published", phases.get("published: int8")),
        ("status Built", marks["status Built"]),
        ("rollout started", marks["rollout started"]),
        ("rollout step (50 %)", marks["rollout step"]),
        ("all traffic", marks["all traffic"]),
    ]
    missing = [name for name, at in rows if at is None]
    assert not missing, f"no time for {missing}; build log:\n{log3[-3000:]}"
    lines, before = [], t0
    for name, at in rows:
        assert at is not None
        at = max(at, before)  # the API's timestamps are whole seconds, floored
        lines.append(f"  {name:<22} {at - t0:7.1f} s  (+{at - before:5.1f} s)")
        before = at
    print(
        "\njourney of digits-3 (seconds after the ModelBuild was applied, +phase; the Job's"
        " scheduling time is the API's, to the second):\n"
        + "\n".join(lines)
        + f"\ngate, digits-1 int8: {passed_int8['reason']}"
        + f"\ngate, digits-2 int8 (blank calibration): {refused_int8['reason']}"
        + "\nanswers by model_version: "
        + "; ".join(f"{phase} {dict(sorted(c.items()))}" for phase, c in split.items())
        + f"\n50 % step: {share:.0%} of answers from digits-3 (configured 50 %, "
        f"{'within' if abs(share - 0.5) <= 0.05 else 'outside'} ±5 points)"
        + f"\ntraffic: {len(report.samples)} requests, {len(failures)} failed, "
        f"P99 {report.p99() * 1000:.0f} ms; config polls {watch.polls}"
    )
