"""The sandbox end to end: real control plane, node agent pods, EndpointSlices, Prometheus."""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest
from kubernetes import client
from prometheus_api_client import PrometheusConnect

from tidal.sandbox import Sandbox
from tidal.sandbox.endpoints import ready_endpoints
from tidal.sandbox.manifests import echo_deployment, service
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox


def apply(sandbox: Sandbox, namespace: str, *docs: dict) -> None:
    sandbox.kubectl(
        "-n", namespace, "apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs)
    )


def pod_pids(sandbox: Sandbox, namespace: str) -> list[int]:
    pids = []
    for f in (sandbox.state_dir / "pods").glob(f"{namespace}_*/*.pid"):
        pids.append(int(f.read_text()))
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kubectl_applies_gets_and_deletes(sandbox: Sandbox, namespace: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}
    out = sandbox.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(cm)).stdout
    assert "configmap/c created" in out
    got = json.loads(sandbox.kubectl("-n", namespace, "get", "configmap", "c", "-o", "json").stdout)
    assert got["data"] == {"k": "v"}
    sandbox.kubectl("-n", namespace, "delete", "configmap", "c")
    missing = sandbox.kubectl("-n", namespace, "get", "configmap", "c", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
    version = sandbox.kubectl("version", "-o", "json").stdout
    assert json.loads(version)["serverVersion"]["gitVersion"].startswith("v1.")


def test_deployment_pods_run_become_ready_and_answer_on_their_ips(
    sandbox: Sandbox, namespace: str
) -> None:
    apply(sandbox, namespace, echo_deployment("echo", replicas=2), service("echo"))
    api = sandbox.api_client()
    eps = wait_for(
        lambda: (e := ready_endpoints(api, namespace, "echo")) and len(e) == 2 and e,
        timeout=60,
        what="two ready endpoints",
    )
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=echo").items
    assert {p.status.pod_ip for p in pods} == {ip for ip, _ in eps}
    assert all(p.status.phase == "Running" for p in pods)
    names = set()
    for ip, port in eps:
        with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=5) as resp:
            names.add(json.loads(resp.read())["pod"])
    assert names == {p.metadata.name for p in pods}
    assert "echo listening" in sandbox.pod_log(namespace, pods[0].metadata.name, "echo")


def test_deleting_a_deployment_stops_its_processes_within_the_grace_period(
    sandbox: Sandbox, namespace: str
) -> None:
    apply(sandbox, namespace, echo_deployment("gone", replicas=2, grace=5))
    api = client.CoreV1Api(sandbox.api_client())
    wait_for(lambda: len(pod_pids(sandbox, namespace)) == 2, timeout=60, what="two pod processes")
    pids = pod_pids(sandbox, namespace)
    assert all(alive(p) for p in pids)
    t0 = time.monotonic()
    # Background propagation: the garbage collector deletes the ReplicaSet and the pods.
    sandbox.kubectl("-n", namespace, "delete", "deployment", "gone", "--cascade=background")
    wait_for(lambda: not any(alive(p) for p in pids), timeout=30, what="pod processes to exit")
    wait_for(lambda: not api.list_namespaced_pod(namespace).items, timeout=30, what="pods removed")
    assert time.monotonic() - t0 < 5 + 10  # grace period plus GC and watch latency


def test_pod_asking_for_too_many_gpus_stays_pending_with_the_schedulers_reason(
    sandbox: Sandbox, namespace: str
) -> None:
    apply(sandbox, namespace, echo_deployment("greedy", replicas=1, gpus=64))
    api = client.CoreV1Api(sandbox.api_client())

    def unschedulable() -> str:
        pods = api.list_namespaced_pod(namespace, label_selector="app=greedy").items
        for cond in (pods[0].status.conditions or []) if pods else []:
            if cond.type == "PodScheduled" and cond.status == "False":
                return f"{cond.reason}: {cond.message}"
        return ""

    why = wait_for(unschedulable, timeout=30, what="PodScheduled=False")
    assert why.startswith("Unschedulable")
    assert "nvidia.com/gpu" in why
    pod = api.list_namespaced_pod(namespace, label_selector="app=greedy").items[0]
    assert pod.status.phase == "Pending" and not pod.spec.node_name


def test_failing_readiness_keeps_a_pod_out_of_the_endpointslice(
    sandbox: Sandbox, namespace: str
) -> None:
    apply(sandbox, namespace, echo_deployment("good", replicas=1), service("good"))
    bad = echo_deployment("bad", replicas=1, ready=False)
    bad["spec"]["template"]["metadata"]["labels"]["app"] = "good"  # same Service selector
    bad["spec"]["selector"]["matchLabels"] = {"app": "good", "variant": "bad"}
    bad["spec"]["template"]["metadata"]["labels"]["variant"] = "bad"
    apply(sandbox, namespace, bad)
    api = sandbox.api_client()
    core = client.CoreV1Api(api)

    def bad_pod_running() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="variant=bad").items
        return bool(pods) and pods[0].status.phase == "Running"

    wait_for(bad_pod_running, timeout=60, what="the unready pod running")
    good_eps = wait_for(
        lambda: ready_endpoints(api, namespace, "good"), timeout=60, what="endpoints"
    )
    # The bad pod has been probed (failing) for a while; it must still not be a ready endpoint.
    time.sleep(3)
    bad_pod = core.list_namespaced_pod(namespace, label_selector="variant=bad").items[0]
    eps = ready_endpoints(api, namespace, "good")
    assert eps == good_eps and len(eps) == 1
    assert bad_pod.status.pod_ip not in {ip for ip, _ in eps}
    ready = next(c for c in bad_pod.status.conditions if c.type == "Ready")
    assert ready.status == "False" and ready.reason == "ContainersNotReady"


def test_prometheus_scrapes_annotated_pods(sandbox: Sandbox, namespace: str) -> None:
    dep = echo_deployment("scraped", replicas=1)
    dep["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "ECHO_GAUGE", "value": "17.5"}
    )
    apply(sandbox, namespace, dep)
    prom = PrometheusConnect(url=sandbox.prometheus_url, disable_ssl=True)
    query = f'echo_gauge{{namespace="{namespace}"}}'
    result = wait_for(lambda: prom.custom_query(query), timeout=60, what=query)
    assert float(result[0]["value"][1]) == 17.5
    assert result[0]["metric"]["pod"].startswith("scraped-")
