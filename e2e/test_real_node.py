"""The user's journey on a real node: built images, kubelet + containerd, kube-proxy, CoreDNS.

The session's real node (``real_sandbox``, shared with the other scenarios) for this module.
The steps run in order and build on each other, as a user's first hour does:

1. the node is a real kubelet with ``nvidia.com/gpu``; pods resolve names through CoreDNS and have
   no default route; each image's console scripts start, as non-root on a read-only root
   filesystem, and each holds its own program's modules only (no sandbox, no other program);
2. ``helm install`` of the chart with the built operator image: the operator runs in a pod with
   the chart's RBAC and in-cluster config, leader election on;
3. ``kubectl apply`` of the single-model example (engines fetched over HTTP from a model store
   in the cluster into the node-local engine cache): Ready, and answered through the Service's
   ClusterIP from a client pod;
4. a replaced pod finds its engine in the node cache (no second download);
5. a surge is scaled up, new replicas get traffic only once kubelet's readiness probe passes,
   and the scale-down after it drains on SIGTERM: no request lost;
6. a runtime container OOM-killed under its memory limit, and a kubelet restart: the service
   keeps answering;
7. the fleet example behind its gateway; the rollout example rolled back to its baseline;
8. ``kubectl logs`` of every component.

Client pods retry a refused or reset connection for up to 5 s, as client libraries' connect-
failure retries do (an endpoint that went away stays in kube-proxy's rules until kubelet
reports it, and one retry may land on it again); every other failure counts.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tidal.operator.core.api import LABEL_ISVC, LABEL_POOL
from tidal.runtime.modelgen import write_mlp
from tidal.runtime.storage import sha256_file
from tidal.sandbox import Sandbox
from tidal.sandbox.incluster import client_pod, command_pod, last_json_line, model_store
from tidal.sandbox.operatorproc import condition, get_isvc, http_forbidden
from tidal.sandbox.realnode import GPU_RESOURCE, NODE_NAME, STATE_DIR
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.realnode, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
NS = "journey"
RELEASE_NS = "tidal-system"
MODELS_DIR = STATE_DIR / "journey-models"  # on the node: hostPath of the model store
CACHE_DIR = STATE_DIR / "engine-cache"  # on the node: the runtime pods' engine cache
RUNTIME_UID = 65532
INFER = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(real_sandbox: Sandbox) -> Iterator[Sandbox]:
    """The session's real node (the other scenarios run on it too), with the journey's
    namespace; the namespace and the chart's release are removed after the module."""
    sb = real_sandbox
    sb.kubectl("create", "namespace", NS)
    wait_for(
        lambda: sb.kubectl("get", "sa", "default", "-n", NS, check=False).returncode == 0,
        timeout=60,
        what="the journey namespace's default service account",
    )
    yield sb
    sb.kubectl("delete", "namespace", NS, "--wait=false", check=False)


@pytest.fixture(scope="module")
def models(real: Sandbox) -> dict[str, str]:
    """Engine files on the node, served by the in-cluster model store: name -> sha256."""
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    MODELS_DIR.chmod(0o755)
    out = {}
    for i, name in enumerate(
        [
            "mlp-small",
            "search",
            "recommend",
            "fraud",
            "translate-de",
            "classifier-v1",
            "classifier-v2",
        ]
    ):
        path = MODELS_DIR / f"{name}.onnx"
        write_mlp(path, seed=i + 1)
        path.chmod(0o644)
        out[name] = sha256_file(path)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    os.chown(CACHE_DIR, RUNTIME_UID, RUNTIME_UID)
    runtime_image = real.images.runtime_cpu.name
    apply_docs(real, model_store(runtime_image, str(MODELS_DIR)), NS)
    real.kubectl("-n", NS, "rollout", "status", "deployment/models", "--timeout=120s", timeout=150)
    return out


# -- helpers ---------------------------------------------------------------------------------------
def apply_docs(sb: Sandbox, docs: list[dict[str, Any]], namespace: str) -> None:
    sb.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))


def pod_phase(sb: Sandbox, name: str) -> str:
    return sb.kubectl(
        "get", "pod", name, "-n", NS, "-o", "jsonpath={.status.phase}", check=False
    ).stdout


def finished_log(sb: Sandbox, name: str, timeout: float) -> str:
    """Wait for a pod of the journey namespace to finish; its log (assert it Succeeded)."""
    phase = wait_for(
        lambda: p if (p := pod_phase(sb, name)) in ("Succeeded", "Failed") else None,
        timeout=timeout,
        interval=0.5,
        what=f"pod {name} to finish",
    )
    log = sb.kubectl("logs", "-n", NS, name, check=False).stdout
    assert phase == "Succeeded", f"pod {name} {phase}:\n{log[-3000:]}\n{describe(sb, name)}"
    return log


def start_pod(sb: Sandbox, pod: dict[str, Any]) -> str:
    name = pod["metadata"]["name"]
    sb.kubectl("delete", "pod", name, "-n", NS, "--ignore-not-found", "--wait=true")
    apply_docs(sb, [pod], NS)
    return str(name)


def run_pod(sb: Sandbox, pod: dict[str, Any], timeout: float) -> str:
    """Run a pod to completion in the journey namespace; its log."""
    return finished_log(sb, start_pod(sb, pod), timeout)


def start_client(
    sb: Sandbox, name: str, url: str, body: dict[str, Any], rate: float, seconds: float
) -> None:
    image = sb.images.runtime_cpu.name
    start_pod(sb, client_pod(name, image, url, body, rate=rate, seconds=seconds))
    wait_for(
        lambda: pod_phase(sb, name) in ("Running", "Succeeded"),
        timeout=60,
        interval=0.3,
        what=f"client pod {name} running",
    )


def client_summary(sb: Sandbox, name: str, timeout: float) -> dict[str, Any]:
    return last_json_line(finished_log(sb, name, timeout))


def assert_all_answered(summary: dict[str, Any], what: str, context: str = "") -> None:
    codes = summary["codes"]
    assert set(codes) == {"200"} and codes["200"] == summary["sent"], (
        f"{what}: not every request was answered 200: {codes}; first failures "
        f"{summary['failed'][:10]}; per second {summary['per_second']}\n{context}"
    )


def describe(sb: Sandbox, *pods: str) -> str:
    return sb.kubectl("describe", "pod", "-n", NS, *pods, check=False).stdout[-4000:]


def isvc_url(name: str, model: str, port: int = 8080) -> str:
    return f"http://{name}.{NS}.svc.cluster.local:{port}/v2/models/{model}/infer"


def model_uri(name: str) -> str:
    return f"http://models.{NS}.svc.cluster.local:8000/{name}.onnx"


def example(sb: Sandbox, file: str, models: dict[str, str]) -> dict[str, Any]:
    """An example manifest as a user adapts it to this cluster: the runtime image built here,
    engines served by the model store (with their sha256), the node-local engine cache, CPU
    requests that fit one 2-core node, and one ONNX Runtime thread per pod."""
    doc = yaml.safe_load((REPO / "examples" / file).read_text())
    spec = doc["spec"]
    runtime = spec.setdefault("runtime", {})
    runtime["image"] = sb.images.runtime_cpu.name
    runtime.pop("storage", None)  # the examples' S3 store: this user serves them over HTTP
    runtime["engineCache"] = {"hostPath": str(CACHE_DIR)}
    runtime["resources"] = {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    env = {e["name"]: e["value"] for e in runtime.get("env", [])}
    env["OMP_NUM_THREADS"] = "1"
    runtime["env"] = [{"name": k, "value": v} for k, v in env.items()]

    def rewrite(model_list: list[dict[str, Any]]) -> None:
        for model in model_list:
            for engine in model["engines"]:
                stem = engine["uri"].rsplit("/", 1)[-1].removesuffix(".onnx")
                engine["uri"] = model_uri(stem)
                engine["sha256"] = models[stem]

    rewrite(spec["models"])
    baseline = (spec.get("rollout") or {}).get("baseline") or {}
    rewrite(baseline.get("models") or [])
    return doc


def wait_ready(sb: Sandbox, name: str, timeout: float = 240) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        body = get_isvc(sb, NS, name)
        return body if condition(body, "Ready").get("status") == "True" else None

    try:
        return wait_for(ready, timeout=timeout, interval=1.0, what=f"{name} Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(sb, name)}") from None


def diagnostics(sb: Sandbox, name: str) -> str:
    status = json.dumps(get_isvc(sb, NS, name).get("status"), indent=1)[-3000:]
    pods = sb.kubectl("get", "pods", "-n", NS, "-o", "wide", check=False).stdout
    events = sb.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False).stdout[
        -3000:
    ]
    return f"status: {status}\npods:\n{pods}\nevents:\n{events}\noperator:\n{operator_log(sb)}"


def operator_log(sb: Sandbox) -> str:
    return sb.kubectl(
        "logs", "-n", RELEASE_NS, "-l", "app.kubernetes.io/name=tidal", "--tail=60", check=False
    ).stdout


def runtime_pods(sb: Sandbox, name: str, pool: str = "primary") -> list[dict[str, Any]]:
    out = sb.kubectl(
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        f"{LABEL_ISVC}={name},{LABEL_POOL}={pool}",
        "-o",
        "json",
    )
    return [
        p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")
    ]


def pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def downloads(sb: Sandbox, file: str) -> int:
    log = sb.kubectl("logs", "-n", NS, "deployment/models", check=False).stdout
    return sum(1 for line in log.splitlines() if f"GET /{file} " in line and '" 200 ' in line)


# -- 1. the node and the images --------------------------------------------------------------------
def test_node_is_a_real_kubelet_with_gpus_dns_and_no_way_out(real: Sandbox) -> None:
    node = json.loads(real.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://2."), info
    assert info["kubeletVersion"].startswith("v1."), info
    wait_for(
        lambda: (
            json.loads(real.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)["status"][
                "allocatable"
            ].get(GPU_RESOURCE)
            == str(real.config.real_node_gpus)
        ),
        timeout=60,
        what="nvidia.com/gpu in the node's allocatable",
    )
    script = (
        "import socket, json;"
        "routes = [l.split()[1] for l in open('/proc/net/route').read().splitlines()[1:]];"
        "name = socket.gethostbyname;"
        "print(json.dumps({'kubernetes': name('kubernetes.default.svc.cluster.local'),"
        " 'dns': name('kube-dns.kube-system.svc.cluster.local'),"
        " 'default_route': '00000000' in routes}))"
    )
    log = run_pod(
        real,
        command_pod("netcheck", real.images.runtime_cpu.name, ["python", "-c", script]),
        timeout=120,
    )
    facts = last_json_line(log)
    assert facts == {"kubernetes": "10.96.0.1", "dns": "10.96.0.10", "default_route": False}, log


# Each image holds its own programs and their dependencies only (pyproject's extras).
IMAGE_CONTENTS = {
    "operator": (["tidal-operator"], ["tidal.operator", "kopf"], ["tidal.runtime", "numpy"]),
    "runtime_cpu": (
        ["tidal-runtime", "tidal-gateway"],
        ["tidal.runtime", "tidal.gateway", "onnxruntime"],
        ["tidal.operator", "kopf", "kubernetes"],
    ),
}


@pytest.mark.parametrize("image", list(IMAGE_CONTENTS))
def test_each_image_s_console_scripts_start_non_root_read_only_and_no_more(
    real: Sandbox, image: str
) -> None:
    ref = getattr(real.images, image).name
    scripts, present, absent = IMAGE_CONTENTS[image]
    check = (
        "import importlib.util as u, json, os, sys;"
        "print(json.dumps({'uid': os.getuid(),"
        " 'modules': {m: u.find_spec(m) is not None for m in sys.argv[1:]}}))"
    )
    modules = [*present, *absent, "tidal.sandbox", "tests", "pandas"]
    command = [
        "sh",
        "-ec",
        f"for s in {' '.join(scripts)}; do "
        '$s --help > /dev/null; echo "$s ok"; done; '
        "touch /cannot-write 2>/dev/null && echo root-writable || echo root-read-only; "
        f'python -c "{check}" {" ".join(modules)}',
    ]
    log = run_pod(
        real, command_pod(f"scripts-{image.replace('_', '-')}", ref, command), timeout=180
    )
    for script in scripts:
        assert f"{script} ok" in log, log
    assert "root-read-only" in log, log
    want = {m: m in present for m in modules}
    assert last_json_line(log) == {"uid": RUNTIME_UID, "modules": want}, log


# -- 2. helm install -------------------------------------------------------------------------------
def helm_binary() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "e2e/helm/build-helm.sh")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def operator_installed(real: Sandbox) -> Iterator[None]:
    image = real.images.operator.name
    repository, tag = image.rsplit(":", 1)
    result = subprocess.run(
        [
            helm_binary(),
            "install",
            "tidal",
            str(REPO / "charts/tidal"),
            f"--kubeconfig={real.kubeconfig}",
            "--namespace",
            RELEASE_NS,
            "--create-namespace",
            "--set",
            f"image.repository={repository}",
            "--set",
            f"image.tag={tag}",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "prometheus.url=http://prometheus.tidal-sandbox:9090",
            "--set",
            "operator.leaderElection.enabled=true",
            "--set",
            "operator.logFormat=plain",
            "--wait",
            "--timeout",
            "4m",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        pods = real.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
        raise AssertionError(f"helm install failed: {result.stderr}\n{pods}\n{operator_log(real)}")
    yield
    # The chart's operator watches every namespace: uninstalled, so the scenarios after this
    # module (each with an operator of its own) do not meet a second one.
    subprocess.run(
        [
            helm_binary(),
            "uninstall",
            "tidal",
            f"--kubeconfig={real.kubeconfig}",
            "--namespace",
            RELEASE_NS,
            "--wait",
            "--timeout",
            "2m",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_helm_install_runs_the_operator_in_a_pod_with_leader_election(
    real: Sandbox, operator_installed: None
) -> None:
    wait_for(
        lambda: "leading:" in operator_log(real),
        timeout=90,
        what="the operator pod to take the leader Lease",
    )
    # By label: the namespace may still hold another test's model store pod as it terminates.
    listed = real.kubectl(
        "get", "pods", "-n", RELEASE_NS, "-l", "app.kubernetes.io/name=tidal", "-o", "json"
    )
    pod = json.loads(listed.stdout)["items"][0]
    container = pod["spec"]["containers"][0]
    assert container["image"] == real.images.operator.name
    assert pod["spec"]["serviceAccountName"].endswith("tidal"), pod["spec"]["serviceAccountName"]
    log = operator_log(real)
    assert http_forbidden(log) is None, log


# -- 3. the single-model example -------------------------------------------------------------------
@pytest.fixture(scope="module")
def single(real: Sandbox, operator_installed: None, models: dict[str, str]) -> str:
    doc = example(real, "onnx-cpu.yaml", models)
    doc["spec"]["autoscaling"] = {
        "minReplicas": 2,
        "maxReplicas": 4,
        "targetQueueDepth": 2,
        "scaleDownDelaySeconds": 10,
    }
    # A capacity per replica, as on a GPU: each batch of at most 2 holds the one execution slot
    # for 100 ms (20 requests a second a replica), without eating the node's two CPUs.
    doc["spec"]["models"][0]["maxBatchSize"] = 2
    doc["spec"]["models"][0]["batching"] = {"maxQueueDelayMs": 5}
    doc["spec"]["models"][0]["warmup"] = {"batchSizes": [1, 2], "iterations": 1}
    doc["spec"]["runtime"]["env"] += [
        {"name": "TIDAL_FAULT_SERVICE_TIME_MS", "value": "100"},
        {"name": "TIDAL_FAULT_MAX_CONCURRENT_BATCHES", "value": "1"},
    ]
    apply_docs(real, [doc], NS)
    wait_ready(real, "mlp-small")
    return "mlp-small"


def test_single_model_example_is_ready_and_answers_through_its_cluster_ip(
    real: Sandbox, single: str
) -> None:
    # Ready says the service serves; both replicas ready is a moment later on a loaded node
    # (a readiness probe that timed out once flips a pod for a second).
    pods = wait_for(
        lambda: (
            ps if len(ps := runtime_pods(real, single)) == 2 and all(map(pod_ready, ps)) else None
        ),
        timeout=120,
        interval=0.5,
        what="both replicas ready",
    )
    for pod in pods:
        container = pod["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        # The spec's image: the status names the image by any of its references, and the
        # README's install test imports the same image under the chart's default name too.
        assert container["image"] == real.images.runtime_cpu.name, container["image"]
    start_client(real, "client-steady", isvc_url(single, single), INFER, rate=10, seconds=8)
    assert_all_answered(
        client_summary(real, "client-steady", 120), "steady traffic", diagnostics(real, single)
    )


# -- 4. the node-local engine cache ----------------------------------------------------------------
def test_a_replaced_pod_takes_its_engine_from_the_node_cache(real: Sandbox, single: str) -> None:
    before = downloads(real, "mlp-small.onnx")
    assert 1 <= before <= 2, f"{before} downloads for two pods on one node"
    assert any(CACHE_DIR.iterdir()), f"nothing in the node cache {CACHE_DIR}"
    victim = runtime_pods(real, single)[0]["metadata"]["name"]
    real.kubectl("delete", "pod", victim, "-n", NS, "--wait=false")

    def replaced() -> bool:
        pods = runtime_pods(real, single)
        names = {p["metadata"]["name"] for p in pods}
        return victim not in names and len(pods) == 2 and all(pod_ready(p) for p in pods)

    wait_for(replaced, timeout=180, interval=0.5, what="a Ready replacement pod")
    assert downloads(real, "mlp-small.onnx") == before, "the replacement downloaded the engine"


# -- 5. surge and drain ----------------------------------------------------------------------------
def test_surge_scales_up_and_the_scale_down_drains_losing_nothing(
    real: Sandbox, single: str
) -> None:
    start_client(real, "client-surge", isvc_url(single, single), INFER, rate=55, seconds=40)

    def scaled() -> int | None:
        n = len([p for p in runtime_pods(real, single) if pod_ready(p)])
        return n if n >= 3 else None

    try:
        wait_for(scaled, timeout=90, interval=0.5, what="a third ready replica during the surge")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(real, single)}") from None
    assert_all_answered(
        client_summary(real, "client-surge", 180), "the surge", diagnostics(real, single)
    )
    # After the surge: light traffic while the autoscaler removes the extra replicas, which
    # drain (not-ready, serve what they have, then exit) on SIGTERM.
    start_client(real, "client-drain", isvc_url(single, single), INFER, rate=8, seconds=45)

    def scaled_down() -> bool:
        return len(runtime_pods(real, single)) == 2

    try:
        wait_for(scaled_down, timeout=120, interval=0.5, what="back to 2 replicas")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(real, single)}") from None
    assert_all_answered(
        client_summary(real, "client-drain", 180), "the scale-down", diagnostics(real, single)
    )


# -- 6. an OOM kill and a kubelet restart ----------------------------------------------------------
def test_runtime_oom_killed_under_its_limit_leaves_the_service_serving(
    real: Sandbox, single: str
) -> None:
    pods = runtime_pods(real, single)
    victim = pods[0]["metadata"]["name"]
    restarts = pods[0]["status"]["containerStatuses"][0]["restartCount"]
    start_client(real, "client-oom", isvc_url(single, single), INFER, rate=8, seconds=30)
    # Fill the container's 1 GiB limit with memory no process holds as its own (a memfd), so
    # the OOM killer's choice is the runtime, the container's PID 1 (made its first choice too:
    # raising a process's oom_score_adj needs no privilege); a hog process with the memory in
    # its own pages would be killed instead, leaving the runtime up.
    hog = (
        "import os; open('/proc/1/oom_score_adj', 'w').write('1000'); "
        "fd = os.memfd_create('hog'); chunk = b'x' * (16 << 20)\n"
        "for _ in range(160): os.write(fd, chunk)"
    )
    exec_result = real.kubectl(
        "exec",
        "-n",
        NS,
        victim,
        "-c",
        "runtime",
        "--",
        "python",
        "-c",
        hog,
        check=False,
        timeout=120,
    )

    def oom_killed() -> dict[str, Any] | None:
        pod = json.loads(real.kubectl("get", "pod", victim, "-n", NS, "-o", "json").stdout)
        status = pod["status"]["containerStatuses"][0]
        last = (status.get("lastState") or {}).get("terminated") or {}
        return (
            status
            if status["restartCount"] > restarts and last.get("reason") == "OOMKilled"
            else None
        )

    try:
        wait_for(oom_killed, timeout=120, interval=0.5, what=f"{victim} OOMKilled and restarted")
    except TimeoutError as exc:
        raise AssertionError(
            f"{exc}\nexec exited {exec_result.returncode}: {exec_result.stdout[-1000:]}"
            f"{exec_result.stderr[-1000:]}\n{describe(real, victim)}"
        ) from None
    assert_all_answered(
        client_summary(real, "client-oom", 120), "the OOM kill", diagnostics(real, single)
    )
    wait_for(
        lambda: all(pod_ready(p) for p in runtime_pods(real, single)),
        timeout=120,
        what="the OOM-killed pod Ready again",
    )


def test_kubelet_restart_leaves_the_service_serving(real: Sandbox, single: str) -> None:
    before = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
        for p in runtime_pods(real, single)
    }
    start_client(real, "client-kubelet", isvc_url(single, single), INFER, rate=8, seconds=25)
    real.node.restart_kubelet()
    from kubernetes import client

    from tidal.sandbox.realnode import advertise_gpus, wait_node_ready

    api = client.CoreV1Api(real.api_client())
    wait_node_ready(api, timeout=120)
    advertise_gpus(api, 2)
    assert_all_answered(
        client_summary(real, "client-kubelet", 120),
        "the kubelet restart",
        diagnostics(real, single),
    )
    after = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"]
        for p in runtime_pods(real, single)
    }
    assert after == before, f"containers restarted with kubelet: {before} -> {after}"


# -- 7. a fleet behind its gateway, a rollout rolled back ------------------------------------------
def test_fleet_example_serves_every_model_through_its_gateway(
    real: Sandbox, operator_installed: None, models: dict[str, str]
) -> None:
    doc = example(real, "fleet.yaml", models)
    doc["spec"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 2}
    apply_docs(real, [doc], NS)
    wait_ready(real, "catalog")
    wait_for(
        lambda: (
            real.kubectl(
                "get",
                "deployment",
                "catalog-gateway",
                "-n",
                NS,
                "-o",
                "jsonpath={.status.readyReplicas}",
                check=False,
            ).stdout
            == "1"
        ),
        timeout=120,
        what="the catalog gateway ready",
    )
    for model in ("search", "recommend", "fraud"):
        name = f"client-fleet-{model}"
        start_client(real, name, isvc_url("catalog", model), INFER, rate=4, seconds=6)
        assert_all_answered(
            client_summary(real, name, 150), f"fleet model {model}", diagnostics(real, "catalog")
        )


def test_rollout_example_with_a_bad_primary_is_rolled_back_to_its_baseline(
    real: Sandbox, operator_installed: None, models: dict[str, str]
) -> None:
    doc = example(real, "rollout-baseline.yaml", models)
    spec = doc["spec"]
    spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 1}
    spec["rollout"]["slo"] = {"p99Ms": 150, "errorRate": 0.01, "for": "5s"}
    # The new version is slow: every answer takes 400 ms more (the baseline has no fault).
    spec["runtime"]["env"].append({"name": "TIDAL_FAULT_ADDED_LATENCY_MS", "value": "400"})
    # The baseline runs the validated version: the same runtime without the fault.
    baseline_runtime = dict(spec["runtime"])
    baseline_runtime["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
    spec["rollout"]["baseline"]["runtime"] = baseline_runtime
    apply_docs(real, [doc], NS)
    wait_ready(real, "classifier")
    start_client(
        real, "client-rollback", isvc_url("classifier", "classifier"), INFER, rate=6, seconds=60
    )

    def rolled_back() -> dict[str, Any] | None:
        body = get_isvc(real, NS, "classifier")
        return body if condition(body, "RolledBack").get("status") == "True" else None

    try:
        body = wait_for(rolled_back, timeout=120, interval=1.0, what="classifier RolledBack")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(real, 'classifier')}") from None
    assert body["status"]["activePool"] == "baseline", body["status"]
    # The move is make-before-break: the Service selects both pools until the EndpointSlices
    # list the baseline's pods as ready, then the baseline alone.
    seen: dict[str, Any] = {}

    def baseline_alone() -> bool:
        service = json.loads(
            real.kubectl("get", "svc", "classifier", "-n", NS, "-o", "json").stdout
        )
        seen["selector"] = service["spec"]["selector"]
        return bool(seen["selector"].get("serving.tidal.dev/pool") == "baseline")

    try:
        wait_for(baseline_alone, timeout=90, interval=1.0, what="the Service on the baseline alone")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; selector {seen}\n{diagnostics(real, 'classifier')}") from None
    summary = client_summary(real, "client-rollback", 150)
    assert set(summary["codes"]) == {"200"}, summary


# -- 8. kubectl logs of every component ------------------------------------------------------------
def test_kubectl_logs_of_every_component(real: Sandbox, single: str) -> None:
    logs = {
        "operator": operator_log(real),
        "runtime": real.kubectl(
            "logs", "-n", NS, runtime_pods(real, single)[0]["metadata"]["name"], check=False
        ).stdout,
        "gateway": real.kubectl("logs", "-n", NS, "deployment/catalog-gateway", check=False).stdout,
        "model store": real.kubectl("logs", "-n", NS, "deployment/models", check=False).stdout,
        "coredns": real.kubectl(
            "logs", "-n", "kube-system", "deployment/coredns", check=False
        ).stdout,
    }
    empty = [k for k, v in logs.items() if not v.strip()]
    assert not empty, f"no log from {empty}"
    assert "mlp-small" in logs["runtime"], logs["runtime"][-2000:]
    assert "CoreDNS" in logs["coredns"], logs["coredns"][-2000:]
