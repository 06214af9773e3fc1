"""The README's "Installing on a real cluster" block, run verbatim, and every example as written.

On the session's real node (kubelet, containerd, kube-proxy, CoreDNS), as a user with a cluster,
a registry holding this release and a default StorageClass would:

1. the release script (``tidal.sandbox.release``, ``make release``) pushes the images and the
   chart to the sandbox's OCI registry (CNCF distribution on 127.0.0.1) under the release's path
   (``tidal.common.release``); the node's containerd resolves the release registry's host
   (``ghcr.io``) to that registry (a hosts.toml mirror), so the chart's default images are
   *pulled* by the kubelet — nothing is imported or retagged by hand. The sandbox has no
   storage provisioner: a default StorageClass with one hostPath PersistentVolume stands in for
   a cluster's; the Prometheus Operator's PodMonitor CRD is a stand-in too (no Prometheus
   Operator runs here: the PodMonitor is created, nothing scrapes through it);
2. the README's block runs as written, from the repository root, with ``helm`` and ``kubectl``
   on the PATH: ``helm install`` of the chart from the checkout with the runtime PodMonitor and
   the chart's model store on (versitygw on the PersistentVolumeClaim, its bucket filled with
   every example's models by the chart's upload Job), ``kubectl apply -f
   examples/onnx-cpu.yaml``, ``kubectl wait``, ``kubectl get``, and one request from ``kubectl
   run``; the service reads its engine from ``s3://models/`` with the store's Secret, on the
   image the operator chose for its backend; the chart pushed by the release script is the
   checkout's;
3. every other InferenceService under ``examples/`` is applied with ``kubectl apply -f`` as
   written and answers every model's requests, except the GPU example, which names an H200 node
   this cluster lacks: its pods stay Pending and condition ``Scaling`` says ``Unschedulable``,
   as the README says. The GitOps example goes to ``ml-serving``, where the store's Secret is
   copied first (as examples/gitops/README.md says to).

The chart's release, the examples and the stand-ins are removed afterwards, so the scenarios
after this module (each with an operator of its own) meet no second operator.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tidal.common import release
from tidal.operator.core.api import LABEL_ISVC
from tidal.runtime.modelgen import EXAMPLE_MODELS
from tidal.sandbox import Sandbox
from tidal.sandbox.cluster import node_pulls_from_registry
from tidal.sandbox.incluster import client_pod, last_json_line
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.realnode import STATE_DIR
from tidal.sandbox.registry import Registry
from tidal.sandbox.release import Target, run_release
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.realnode, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
STORE_NS = "tidal-system"
STORE_DIR = STATE_DIR / "readme-store"  # on the node: the hostPath of the stand-in volume
STORAGE_CLASS = "sandbox-default"
STORE_PV = "readme-model-store"
INFER = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
# The InferenceService examples other than the README's, and the namespace each goes to (the
# GitOps one where its Argo CD Application syncs it).
EXAMPLE_NAMESPACES = {
    "multi-model-autoscaling.yaml": "default",
    "fleet.yaml": "default",
    "rollout-baseline.yaml": "default",
    "gitops/models/mlp-small.yaml": "ml-serving",
}
GPU_EXAMPLE = "gpu/tensorrt-h200.yaml"
# The operator's pods among the chart's (the model store's share the chart's name label).
OPERATOR_PODS = "app.kubernetes.io/name=tidal,app.kubernetes.io/component=operator"
# The images the release script pushes and the chart's defaults pull.
PUSHED_KINDS = ("operator", "runtime-cpu", "modelstore")


def readme_install_block() -> str:
    """The first ``sh`` block under the README's "Installing on a real cluster" heading."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Installing on a real cluster", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    assert found, "no sh block under 'Installing on a real cluster' in README.md"
    return found.group(1)


def isvc_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind")]


# -- fixtures --------------------------------------------------------------------------------------
# The Prometheus Operator's PodMonitor kind, as a stand-in CRD (no Prometheus Operator here).
PODMONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "scope": "Namespaced",
        "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


# A default StorageClass without a provisioner and one volume for the store's claim: what a
# cluster's provisioner would make. Retain: the test removes the volume and its directory.
def storage_stand_in() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "kubernetes.io/no-provisioner",
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": STORE_PV},
            "spec": {
                "storageClassName": STORAGE_CLASS,
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(STORE_DIR), "type": "Directory"},
            },
        },
    ]


# The node pulls the release's images from the sandbox's registry unless TIDAL_SANDBOX_REGISTRY=0
# (tidal.sandbox.cluster.SandboxConfig.registry); with it 0 the images built here are tagged in
# its containerd under the release's names instead (the path before the registry ran).
NODE_PULLS = node_pulls_from_registry()


@pytest.fixture(scope="module")
def registry(real_sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """The sandbox's registry, or one of this module's when the sandbox runs none."""
    if real_sandbox.registry is not None:
        yield real_sandbox.registry
        return
    assert real_sandbox.binaries is not None
    own = Registry.start(real_sandbox.binaries.registry, tmp_path_factory.mktemp("registry"))
    yield own
    own.stop()


def sandbox_target(registry: Registry) -> Target:
    """The registry under the release registry's path (ghcr.io/tidal-serving ->
    127.0.0.1:PORT/tidal-serving), which the node's containerd mirrors when it pulls."""
    return Target(f"{registry.host}/{release.REGISTRY.split('/', 1)[1]}")


@pytest.fixture(scope="module")
def pushed(real_sandbox: Sandbox, registry: Registry) -> dict[str, dict[str, str]]:
    """The release script, twice, to the registry: reference -> digest each time."""
    sb = real_sandbox
    target = sandbox_target(registry)
    node_has = set(sb.node.image_names())
    assert not node_has & {release.image(k) for k in PUSHED_KINDS}, (
        f"the node holds release images before any pull: {sorted(node_has)}"
    )
    runs = {}
    for run in ("first", "second"):
        t0 = time.monotonic()
        runs[run] = run_release(target)
        print(f"release script ({run} run): {time.monotonic() - t0:.1f} s: {runs[run]}")
    return runs


@pytest.fixture(scope="module")
def published(real_sandbox: Sandbox, pushed: dict[str, dict[str, str]]) -> Iterator[Sandbox]:
    """The release in the registry (pulled by the node, or tagged in its containerd when the
    sandbox runs no registry), the PodMonitor kind, a default StorageClass and its volume."""
    sb = real_sandbox
    if sb.registry is None:
        built = {
            "operator": sb.images.operator.name,
            "runtime-cpu": sb.images.runtime_cpu.name,
            "modelstore": sb.images.modelstore.name,
        }
        for kind, name in built.items():
            done = sb.node.ctr("images", "tag", "--force", name, release.image(kind))
            assert done.returncode == 0, f"ctr images tag {name}: {done.stderr}"
        from kubernetes import client

        sb.node.wait_images_visible(
            client.CoreV1Api(sb.api_client()), [release.image(k) for k in built], timeout=120
        )
    sb.kubectl("apply", "-f", "-", input=yaml.safe_dump(PODMONITOR_CRD))
    sb.wait_established("crd/podmonitors.monitoring.coreos.com")
    shutil.rmtree(STORE_DIR, ignore_errors=True)
    STORE_DIR.mkdir(parents=True)
    os.chown(STORE_DIR, 65532, 65532)  # the store's user (hostPath gets no fsGroup)
    sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(storage_stand_in()))
    yield sb
    sb.kubectl("delete", "pv", STORE_PV, "--ignore-not-found", "--wait=false", check=False)
    sb.kubectl("delete", "storageclass", STORAGE_CLASS, "--ignore-not-found", check=False)
    sb.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", check=False)
    shutil.rmtree(STORE_DIR, ignore_errors=True)


def helm_binary() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "e2e/helm/build-helm.sh")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.fixture(scope="module")
def installed(published: Sandbox) -> Iterator[subprocess.CompletedProcess[str]]:
    """The README's block, run verbatim by bash from the repository root."""
    sb = published
    assert sb.binaries is not None
    env = {
        **os.environ,
        "KUBECONFIG": str(sb.kubeconfig),
        "PATH": f"{Path(helm_binary()).parent}:{sb.binaries.kubectl.parent}:{os.environ['PATH']}",
    }
    env = {k: v for k, v in env.items() if not k.startswith("HELM_")}
    block = readme_install_block()
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    yield result
    # Services first (the operator still runs to see them go), then the release.
    for file, namespace in [("onnx-cpu.yaml", "default"), *EXAMPLE_NAMESPACES.items()]:
        sb.kubectl(
            "delete", "-n", namespace, "-f", str(EXAMPLES / file), "--ignore-not-found",
            "--wait=true", "--timeout=120s", check=False, timeout=150,
        )  # fmt: skip
    sb.kubectl("delete", "-f", str(EXAMPLES / GPU_EXAMPLE), "--ignore-not-found", check=False)
    sb.kubectl("delete", "secret", "model-store", "-n", "ml-serving", "--ignore-not-found",
               check=False)  # fmt: skip
    subprocess.run(
        [helm_binary(), "uninstall", "tidal", f"--kubeconfig={sb.kubeconfig}",
         "--namespace", "tidal-system", "--wait", "--timeout", "2m"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


# -- helpers ---------------------------------------------------------------------------------------
def diagnostics(sb: Sandbox, namespace: str, name: str | None = None) -> str:
    status = ""
    if name is not None:
        status = json.dumps(get_isvc(sb, namespace, name).get("status"), indent=1)[-3000:]
    pods = sb.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    events = sb.kubectl(
        "get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False
    ).stdout[-3000:]
    operator = sb.kubectl(
        "logs", "-n", "tidal-system", "-l", OPERATOR_PODS, "--tail=40",
        check=False,
    ).stdout  # fmt: skip
    return f"status: {status}\npods:\n{pods}\nevents:\n{events}\noperator:\n{operator}"


def wait_ready(sb: Sandbox, namespace: str, name: str, timeout: float = 420) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        body = get_isvc(sb, namespace, name)
        return body if condition(body, "Ready").get("status") == "True" else None

    try:
        return wait_for(ready, timeout=timeout, interval=1.0, what=f"{namespace}/{name} Ready")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(sb, namespace, name)}") from None


def send_traffic(sb: Sandbox, namespace: str, service: str, model: str) -> dict[str, Any]:
    """A client pod's requests (4 a second for 4 s) to one model through the Service; its
    summary, every request answered 200."""
    name = f"client-{service}-{model}"[:60].rstrip("-")
    url = f"http://{service}.{namespace}.svc.cluster.local:8080/v2/models/{model}/infer"
    pod = client_pod(name, release.image("runtime-cpu"), url, INFER, rate=4, seconds=4)
    sb.kubectl("delete", "pod", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    sb.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))

    def phase() -> str | None:
        got = sb.kubectl(
            "get", "pod", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False
        ).stdout
        return got if got in ("Succeeded", "Failed") else None

    try:
        wait_for(phase, timeout=240, interval=0.5, what=f"client pod {name} to finish")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(sb, namespace, service)}") from None
    log = sb.kubectl("logs", "-n", namespace, name, check=False).stdout
    summary = last_json_line(log)
    codes = summary["codes"]
    assert set(codes) == {"200"} and codes["200"] == summary["sent"] > 0, (
        f"{namespace}/{service} model {model}: not every request was answered 200: {codes}; "
        f"first failures {summary['failed'][:10]}\n{diagnostics(sb, namespace, service)}"
    )
    sb.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=False)
    return summary


def copy_store_secret(sb: Sandbox, namespace: str) -> None:
    """The chart's copy of the store's keys (Secret model-store in default) into ``namespace``."""
    secret = json.loads(sb.kubectl("get", "secret", "model-store", "-o", "json").stdout)
    copy = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "model-store", "namespace": namespace},
        "type": "Opaque",
        "data": secret["data"],
    }
    sb.kubectl("apply", "-f", "-", input=yaml.safe_dump(copy))


def runtime_images(sb: Sandbox, namespace: str, name: str) -> set[str]:
    out = sb.kubectl("get", "pods", "-n", namespace, "-l", f"{LABEL_ISVC}={name}", "-o", "json")
    return {c["image"] for p in json.loads(out.stdout)["items"] for c in p["spec"]["containers"]}


# -- the README's block ----------------------------------------------------------------------------
def test_readme_install_block_runs_verbatim_and_the_example_answers(
    installed: subprocess.CompletedProcess[str],
) -> None:
    assert installed.returncode == 0, (
        f"the README's block failed ({installed.returncode}):\n{readme_install_block()}\n"
        f"stdout:\n{installed.stdout[-3000:]}\nstderr:\n{installed.stderr[-3000:]}"
    )
    # `kubectl get inferenceservices` printed the service, Ready.
    assert re.search(r"^mlp-small\s+True", installed.stdout, re.M), installed.stdout
    # `kubectl run`'s request was answered: the model's output tensor.
    answers = [line for line in installed.stdout.splitlines() if line.startswith("{")]
    assert answers and json.loads(answers[-1])["model_name"] == "mlp-small", installed.stdout


def test_readme_block_installed_the_model_store_on_the_default_class_with_every_model(
    published: Sandbox, installed: subprocess.CompletedProcess[str]
) -> None:
    """The chart's store: its claim bound through the default StorageClass, its keys generated
    and copied for the examples' namespace, and the upload Job's models in its bucket (the
    posix backend keeps a bucket as a directory of the volume)."""
    sb = published
    assert installed.returncode == 0, installed.stderr[-3000:]
    claims = json.loads(sb.kubectl("get", "pvc", "-n", STORE_NS, "-o", "json").stdout)["items"]
    assert [(c["spec"].get("storageClassName"), c["status"]["phase"]) for c in claims] == [
        (STORAGE_CLASS, "Bound")
    ], claims
    keys = {}
    for namespace, name in [(STORE_NS, "tidal-model-store"), ("default", "model-store")]:
        secret = json.loads(sb.kubectl("get", "secret", name, "-n", namespace, "-o", "json").stdout)
        keys[namespace] = secret["data"]
    assert keys[STORE_NS] == keys["default"] and set(keys["default"]) == {
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
    }, sorted(keys)  # fmt: skip
    stored = sorted(
        str(path.relative_to(STORE_DIR / "models"))
        for path in (STORE_DIR / "models").rglob("*.onnx")
    )
    assert stored == sorted(EXAMPLE_MODELS), f"the store's bucket holds {stored}"


def test_readme_service_runs_its_backend_s_image_and_answers(
    published: Sandbox, installed: subprocess.CompletedProcess[str]
) -> None:
    sb = published
    assert installed.returncode == 0, installed.stderr[-3000:]
    wait_ready(sb, "default", "mlp-small")
    operator_pod = json.loads(
        sb.kubectl("get", "pods", "-n", "tidal-system", "-l", OPERATOR_PODS, "-o", "json").stdout
    )["items"]
    assert {c["image"] for p in operator_pod for c in p["spec"]["containers"]} == {
        release.image("operator")
    }
    assert runtime_images(sb, "default", "mlp-small") == {release.image("runtime-cpu")}
    send_traffic(sb, "default", "mlp-small", "mlp-small")
    # The operator's resident memory while it serves this service (bench/RESULTS.md, "Images"),
    # well inside the chart's 512Mi limit.
    status = sb.kubectl(
        "exec", "-n", "tidal-system", "deployment/tidal", "--",
        "python", "-c", "print(open('/proc/1/status').read())",
    ).stdout  # fmt: skip
    rss_kib = int(next(x for x in status.splitlines() if x.startswith("VmRSS")).split()[1])
    print(f"operator pod RSS: {rss_kib / 1024:.1f} MiB")
    assert rss_kib < 256 * 1024, status


# -- the release: pushed by the script, pulled by the node -----------------------------------------
def test_release_script_pushes_the_same_image_digests_twice(
    pushed: dict[str, dict[str, str]],
) -> None:
    first, second = pushed["first"], pushed["second"]
    images = {ref for ref in first if not ref.startswith("oci://")}
    assert len(images) == len(PUSHED_KINDS), first
    assert all(first[r].startswith("sha256:") for r in images), first
    assert {r: first[r] for r in images} == {r: second[r] for r in images}, (
        f"unchanged sources pushed other image digests: {first} then {second}"
    )
    # The chart's manifest is stamped with the time of its push by helm (its content is the
    # same: tests/sandbox/test_registry.py): only that it was pushed is checked here.
    charts = sorted(set(first) - images)
    assert len(charts) == 1 and first[charts[0]].startswith("sha256:"), first
    print(f"chart digests: {first[charts[0]]} then {second[charts[0]]}")


def test_pushed_chart_is_the_checkout_s(
    registry: Registry, pushed: dict[str, dict[str, str]]
) -> None:
    target = sandbox_target(registry)
    shown = subprocess.run(
        [helm_binary(), "show", "chart", target.chart, "--version", release.VERSION,
         "--plain-http"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    checkout = yaml.safe_load((REPO / "charts/tidal/Chart.yaml").read_text())
    assert yaml.safe_load(shown.stdout) == checkout, shown.stdout


def test_readme_block_made_the_runtime_podmonitor(
    published: Sandbox, installed: subprocess.CompletedProcess[str]
) -> None:
    assert installed.returncode == 0, installed.stderr[-3000:]
    monitors = published.kubectl("get", "podmonitors", "-n", "tidal-system", "-o", "name")
    assert monitors.stdout.strip(), f"the README's block made no PodMonitor: {installed.stdout}"


@pytest.mark.skipif(
    not NODE_PULLS, reason="TIDAL_SANDBOX_REGISTRY=0: the node's images are tagged, not pulled"
)
def test_node_pulled_the_pushed_images_from_the_registry(
    published: Sandbox,
    registry: Registry,
    pushed: dict[str, dict[str, str]],
    installed: subprocess.CompletedProcess[str],
) -> None:
    sb = published
    assert installed.returncode == 0, installed.stderr[-3000:]
    target = sandbox_target(registry)
    held = sb.node.image_digests()
    for kind in PUSHED_KINDS:
        name = release.image(kind)
        assert held.get(name) == pushed["first"][target.image(kind)], (
            f"{name}: the node holds {held.get(name)}, the registry got "
            f"{pushed['first'][target.image(kind)]}; node images {held}"
        )
    # containerd resolved each release name through the mirror: its request for the tag, with
    # the mirrored host as ``ns``, answered by the registry. It fetches only the blobs its content
    # store lacks: the sandbox imported the same archives (under localhost/tidal/… names, for the
    # other scenarios), so here the pull moves the manifest's resolution and no layer.
    log = registry.process.log_path.read_text(errors="replace")
    host = release.REGISTRY.split("/", 1)[0]
    for kind in PUSHED_KINDS:
        request = (
            rf'"(HEAD|GET) /v2/{re.escape(target.repository(kind))}/manifests/'
            rf'{re.escape(release.VERSION)}\?ns={re.escape(host)} HTTP/1.1" 200 .*"containerd/'
        )
        containerd = [line for line in log.splitlines() if '"containerd/' in line]
        assert re.search(request, log), (
            f"no pull of {release.image(kind)} by containerd in the registry's log; "
            f"containerd's requests: {containerd[-20:]}"
        )
    print("containerd's requests to the registry:", *containerd, sep="\n  ")


# -- every other example, as written ---------------------------------------------------------------
@pytest.mark.parametrize("file", list(EXAMPLE_NAMESPACES), ids=lambda f: f.removesuffix(".yaml"))
def test_example_applied_as_written_answers_every_model(
    published: Sandbox, installed: subprocess.CompletedProcess[str], file: str
) -> None:
    sb = published
    assert installed.returncode == 0, installed.stderr[-3000:]
    namespace = EXAMPLE_NAMESPACES[file]
    sb.kubectl("create", "namespace", namespace, check=False)
    if namespace != "default":  # the store's keys, as examples/gitops/README.md says
        copy_store_secret(sb, namespace)
    path = EXAMPLES / file
    (doc,) = isvc_docs(path)
    name = doc["metadata"]["name"]
    sb.kubectl("apply", "-n", namespace, "-f", str(path))
    try:
        wait_ready(sb, namespace, name)
        assert runtime_images(sb, namespace, name) == {release.image("runtime-cpu")}
        models = {m["name"] for m in doc["spec"]["models"]}
        baseline = ((doc["spec"].get("rollout") or {}).get("baseline") or {}).get("models") or []
        models |= {m["name"] for m in baseline}
        for model in sorted(models):
            send_traffic(sb, namespace, name, model)
    finally:
        # One at a time: the next example's pods need the node's room.
        sb.kubectl(
            "delete", "-n", namespace, "-f", str(path), "--wait=true", "--timeout=120s",
            check=False, timeout=150,
        )  # fmt: skip


def test_gpu_example_without_its_gpu_node_says_unschedulable(
    published: Sandbox, installed: subprocess.CompletedProcess[str]
) -> None:
    sb = published
    assert installed.returncode == 0, installed.stderr[-3000:]
    path = EXAMPLES / GPU_EXAMPLE
    (doc,) = isvc_docs(path)
    name = doc["metadata"]["name"]
    sb.kubectl("apply", "-f", str(path))

    def unschedulable() -> dict[str, Any] | None:
        cond = condition(get_isvc(sb, "default", name), "Scaling")
        return cond if cond.get("reason") == "Unschedulable" else None

    try:
        cond = wait_for(unschedulable, timeout=240, interval=1.0, what=f"{name} Unschedulable")
        assert "pending unschedulable" in cond.get("message", ""), cond
        assert runtime_images(sb, "default", name) == {release.image("runtime")}
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(sb, 'default', name)}") from None
    finally:
        sb.kubectl("delete", "-f", str(path), "--wait=true", "--timeout=120s", check=False)
