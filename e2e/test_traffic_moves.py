"""End to end: every traffic move is make-before-break (issue 31), on the real node.

One InferenceService with two pools on the real runtime, under steady load that finds its
targets through the Service's EndpointSlices (as kube-proxy does). While the load runs, the
test drives every kind of move the operator makes:

1. **promotion**: ``minReplicas`` 1 -> 2 with ``standbyReplicas: 1`` promotes the standby pod;
2. **flip**: ``activePool: baseline`` (the planner warms the baseline, then switches);
3. **flip back**: ``activePool: primary``;
4. **demotion and scale-down**: ``minReplicas`` back to 1 (after ``scaleDownDelaySeconds``).

Beside the load, a watch on the Service's EndpointSlices records every version of them (not a
poll: a gap of a few milliseconds would slip between polls). Asserted: no request failed; from
the first ready endpoint on, the slices never listed zero ready endpoints; every move happened
(the timeline shows two primary pods, then only baseline pods, then only primary pods, then
one); and the flip made before it broke: the slices listed both pools' pods before the
primary's left. That last one fails without make-before-break (a selector change is a single
slice update, straight from one pool to the other), whatever the load; the first two fail only
when the EndpointSlice controller lags, as under load. On a failure the message carries the
slice timeline and the operator's traffic log.

Run it beside a second sandbox or a CPU hog: on an idle machine the EndpointSlice controller
keeps up with the labels and a one-phase move rarely shows; on a loaded one it lags by seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    INFER_BODY,
    apply,
    baseline_rollout,
    install_crd,
    model_service,
    running_operator,
)

from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(600)]

RPS = 20.0
NAME = "moves"
POOLS = {"primary", "baseline"}


class SliceTimeline:
    """Watches the Service's EndpointSlices in a thread; ``events`` is every change of the ready
    set as (seconds since start, sorted pod names listed ready across all slices)."""

    def __init__(self, api_client: Any, namespace: str, service: str) -> None:
        self.api_client, self.namespace, self.service = api_client, namespace, service
        self.events: list[tuple[float, tuple[str, ...]]] = []
        self.errors: list[str] = []
        self._slices: dict[str, frozenset[str]] = {}
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slice-watch")

    def _record(self) -> None:
        ready = tuple(sorted(frozenset().union(*self._slices.values())))
        if not self.events or self.events[-1][1] != ready:
            self.events.append((round(time.monotonic() - self._t0, 3), ready))

    @staticmethod
    def _ready(sl: Any) -> frozenset[str]:
        return frozenset(
            ep.target_ref.name
            for ep in sl.endpoints or []
            if ep.target_ref is not None
            and (ep.conditions is None or ep.conditions.ready is not False)
        )

    def _run(self) -> None:
        from kubernetes import client, watch

        api = client.DiscoveryV1Api(self.api_client)
        selector = f"kubernetes.io/service-name={self.service}"
        while not self._stop.is_set():
            try:
                listed = api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                self._slices = {s.metadata.name: self._ready(s) for s in listed.items}
                self._record()
                w = watch.Watch()
                for event in w.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=30,
                ):
                    sl = event["object"]
                    if event["type"] == "DELETED":
                        self._slices.pop(sl.metadata.name, None)
                    else:
                        self._slices[sl.metadata.name] = self._ready(sl)
                    self._record()
                    if self._stop.is_set():
                        w.stop()
            except Exception as exc:  # a watch that broke off is listed again
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                self._stop.wait(0.2)

    def __enter__(self) -> SliceTimeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=40)

    def pools(self) -> list[tuple[float, tuple[str, ...]]]:
        """The timeline with each pod named by its pool (``<isvc>-<pool>-<hash>-<id>``)."""
        return [(t, tuple(_pool(p) for p in pods)) for t, pods in self.events]

    def gaps(self) -> list[float]:
        """When the slices listed no ready endpoint after having listed one."""
        seen, out = False, []
        for t, pods in self.events:
            if pods:
                seen = True
            elif seen:
                out.append(t)
        return out

    def handovers(self, to: str) -> list[tuple[str, ...]]:
        """The ready sets between the last one of the other pool alone and the first one of
        ``to`` alone: make-before-break lists both pools there; a one-phase flip (a selector
        change is one slice update) goes straight from one pool to the other."""
        pools = [(t, {_pool(p) for p in pods}) for t, pods in self.events]
        end = next((i for i, (_, ps) in enumerate(pools) if ps == {to}), None)
        if end is None:
            return []
        start = max((i for i, (_, ps) in enumerate(pools[:end]) if ps and to not in ps), default=0)
        return [self.events[i][1] for i in range(start + 1, end)]

    def describe(self) -> str:
        lines = [f"{t:8.3f}s {','.join(pods) or '(none)'}" for t, pods in self.events]
        return "EndpointSlice ready set over time:\n" + "\n".join(lines[-80:])


def _pool(pod: str) -> str:
    return "baseline" if pod.startswith(f"{NAME}-baseline-") else "primary"


def _patch(sandbox: Any, namespace: str, spec: str) -> None:
    sandbox.kubectl("patch", "inferenceservice", NAME, "-n", namespace, "--type=merge", "-p", spec)


def _only(timeline: SliceTimeline, pool: str, count: int | None = None) -> bool:
    pods = timeline.events[-1][1] if timeline.events else ()
    pools = [_pool(p) for p in pods]
    return bool(pools) and set(pools) == {pool} and (count is None or len(pools) == count)


def test_flip_promotion_and_demotion_never_leave_the_service_without_endpoints(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    manifest = model_service(
        NAME,
        tmp_path / "mlp.onnx",
        env={},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 3,
            "standbyReplicas": 1,
            "targetQueueDepth": 50,
            "scaleDownDelaySeconds": 3,
        },
        rollout=baseline_rollout(drain_seconds=3),
    )
    log_path = tmp_path / "operator.log"
    with running_operator(sandbox, namespace, log_path) as operator:
        apply(sandbox, namespace, manifest)

        def warm() -> bool:
            pools = (get_isvc(sandbox, namespace, NAME).get("status") or {}).get("pools") or {}
            primary, baseline = pools.get("primary", {}), pools.get("baseline", {})
            return (
                primary.get("ready", 0) >= 1  # serving
                and primary.get("standby", 0) >= 1
                and baseline.get("ready", 0) >= 1
            )

        wait_for(warm, timeout=240, interval=1.0, what="both pools ready, a standby warm")

        steps: list[tuple[str, float]] = []
        problems: list[str] = []
        done = threading.Event()

        with SliceTimeline(sandbox.api_client(), namespace, NAME) as timeline:
            wait_for(lambda: _only(timeline, "primary", 1), timeout=60, what="one primary pod")

            def drive() -> None:
                try:
                    moves = [
                        ("promote", '{"spec":{"autoscaling":{"minReplicas":2}}}', "primary", 2),
                        (
                            "flip",
                            '{"spec":{"rollout":{"activePool":"baseline"}}}',
                            "baseline",
                            None,
                        ),
                        ("back", '{"spec":{"rollout":{"activePool":"primary"}}}', "primary", None),
                        ("demote", '{"spec":{"autoscaling":{"minReplicas":1}}}', "primary", 1),
                    ]
                    for what, patch, pool, count in moves:
                        time.sleep(3.0)  # steady traffic before each move
                        steps.append((what, round(time.monotonic() - timeline._t0, 3)))
                        _patch(sandbox, namespace, patch)
                        wait_for(
                            lambda p=pool, c=count: _only(timeline, p, c),
                            timeout=150,
                            interval=0.2,
                            what=f"{what}: the slices list only {pool} pods ({count or 'any'})",
                            describe=lambda: timeline.events[-3:],
                        )
                    time.sleep(3.0)
                except Exception as exc:
                    problems.append(f"{type(exc).__name__}: {exc}")
                finally:
                    done.set()

            driver = threading.Thread(target=drive, daemon=True, name="moves")
            load = LoadGenerator(
                sandbox.api_client(), namespace, NAME, "mlp", INFER_BODY, lambda t: RPS
            )
            driver.start()
            report = asyncio.run(load.run_until(lambda t: done.is_set() or t > 540))
            driver.join(timeout=5)

        traffic_log = [
            ln[:240]
            for ln in operator.log().splitlines()
            if " traffic " in ln or " roles (" in ln or "Endpoints" in ln
        ]
        story = (
            f"moves at {steps}\n{timeline.describe()}\nwatch errors: {timeline.errors[-5:]}\n"
            "operator:\n" + "\n".join(traffic_log[-40:])
        )
        failures = report.failures()
        print(f"\n{len(report.samples)} requests, {len(failures)} failed; moves at {steps}")
        print(timeline.describe())
        assert not problems, f"{problems}\n{story}"
        assert [s for s, _ in steps] == ["promote", "flip", "back", "demote"], story
        # Every move happened, in the slices' own record: two primary pods after the promotion,
        # baseline only after the flip, primary only after the way back, one pod at the end.
        pools = [p for _, p in timeline.pools()]
        assert ("primary", "primary") in pools, story
        assert any(p and set(p) == {"baseline"} for p in pools), story
        assert pools[-1] == ("primary",), story
        # The flip itself, as the slices show it: the baseline's pods were listed beside the
        # primary's before the primary's left (without make-before-break: straight over).
        both = [p for p in timeline.handovers("baseline") if {_pool(n) for n in p} == POOLS]
        assert both, f"no moment with both pools listed during the flip\n{story}"
        assert not timeline.gaps(), f"no ready endpoint at {timeline.gaps()}s\n{story}"
        assert not failures, f"{failures[:5]}\n{story}"
        assert len(report.samples) > RPS * 10, story  # the load ran throughout
        with contextlib.suppress(Exception):
            (tmp_path / "slices.txt").write_text(timeline.describe())
