"""The chart's model store (modelStore): what `helm template` renders for the store, its keys,
the examples' upload Job and the user's own S3; and that the README's install values render
objects a cluster with only a registry and a default StorageClass can run."""

from __future__ import annotations

import base64
import re
import shlex
from typing import Any

import pytest
from chart_helpers import REPO, Doc, Helm, by_kind

from tidal.common import release
from tidal.runtime.modelgen import EXAMPLE_MODELS

STORE = ("--set", "modelStore.enabled=true")
UPLOAD = ("--set", "modelStore.exampleModels=true")
# The images the release script pushes (e2e/sandbox/release.py's PUSHED_KINDS): what a registry
# holding this release has.
PUSHED = {release.image(kind) for kind in ("operator", "runtime-cpu", "modelstore")}
# Kinds a cluster has without add-ons, and the one the README names as a prerequisite.
BUILT_IN_KINDS = {
    "ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment",
    "Job", "PersistentVolumeClaim", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount",
}  # fmt: skip
README_PREREQUISITE_KINDS = {"PodMonitor"}


def named(docs: list[Doc], kind: str, name: str, namespace: str | None = None) -> Doc:
    found = [
        d
        for d in by_kind(docs, kind)
        if d["metadata"]["name"] == name
        and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, (
        f"{kind} {namespace}/{name}: {[d['metadata'] for d in by_kind(docs, kind)]}"
    )
    return found[0]


def decoded(secret: Doc) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def pod_specs(docs: list[Doc]) -> list[tuple[str, Doc]]:
    """(kind/name, pod spec) of every workload rendered."""
    specs = []
    for doc in docs:
        template = (
            doc.get("spec", {}).get("template") if doc["kind"] in ("Deployment", "Job") else None
        )
        if template is not None:
            specs.append((f"{doc['kind']}/{doc['metadata']['name']}", template["spec"]))
    return specs


def images(spec: Doc) -> list[str]:
    return [c["image"] for c in spec.get("initContainers", []) + spec["containers"]]


def test_default_install_has_no_model_store(helm: Helm) -> None:
    docs = helm.template()
    store = [d for d in docs if "model-store" in str(d["metadata"].get("labels", {}))]
    assert not store and not by_kind(docs, "PersistentVolumeClaim") and not by_kind(docs, "Job")


def test_store_runs_versitygw_on_a_default_class_claim_behind_service_models(helm: Helm) -> None:
    docs = helm.template(*STORE, release="tidal")
    deployment = named(docs, "Deployment", "tidal-model-store", "tidal-system")
    spec = deployment["spec"]["template"]["spec"]
    assert images(spec) == [release.image("modelstore")] * 2, images(spec)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one writer of the volume
    (container,) = spec["containers"]
    assert container["args"][-2:] == ["posix", "/data"], container["args"]
    assert spec["initContainers"][0]["command"] == ["mkdir", "-p", "/data/models"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    claim = named(docs, "PersistentVolumeClaim", "tidal-model-store", "tidal-system")
    assert "storageClassName" not in claim["spec"], "the default class is the one left unnamed"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "tidal-model-store"
    service = named(docs, "Service", "models", "tidal-system")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(80, "s3")]
    operator = named(docs, "Deployment", "tidal", "tidal-system")
    assert service["spec"]["selector"] != operator["spec"]["selector"]["matchLabels"]


def test_store_keys_are_generated_once_and_copied_for_the_examples_namespace(
    helm: Helm,
) -> None:
    docs = helm.template(*STORE, release="tidal")
    own = decoded(named(docs, "Secret", "tidal-model-store", "tidal-system"))
    copy = decoded(named(docs, "Secret", "model-store", "default"))
    assert own == copy and set(own) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, own
    assert len(own["AWS_SECRET_ACCESS_KEY"]) == 40 and own["AWS_ACCESS_KEY_ID"].startswith("tidal")
    again = decoded(named(helm.template(*STORE, release="tidal"), "Secret", "model-store"))
    assert again != own, "each render without a cluster generates new keys (lookup finds none)"
    env = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in named(docs, "Deployment", "tidal-model-store")["spec"]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    assert env == {
        "AWS_ACCESS_KEY_ID": "tidal-model-store",
        "AWS_SECRET_ACCESS_KEY": "tidal-model-store",
    }


def test_given_keys_are_used_and_copied_to_every_client_namespace(helm: Helm) -> None:
    docs = helm.template(
        *STORE,
        "--set", "modelStore.credentials.accessKeyId=AKID",
        "--set", "modelStore.credentials.secretAccessKey=SECRET",
        "--set", "modelStore.clientNamespaces={team-a,team-b}",
    )  # fmt: skip
    secrets = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): decoded(d)
        for d in by_kind(docs, "Secret")
    }
    expected = {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET"}
    assert secrets == {
        ("tidal-system", "t-tidal-model-store"): expected,
        ("team-a", "model-store"): expected,
        ("team-b", "model-store"): expected,
    }, secrets


def test_half_given_keys_fail_the_render(helm: Helm) -> None:
    result = helm(
        "template", "t", str(REPO / "charts" / "tidal"),
        *STORE, "--set", "modelStore.credentials.accessKeyId=AKID",
    )  # fmt: skip
    assert result.returncode != 0 and "accessKeyId and secretAccessKey" in result.stderr, (
        result.stderr
    )


def test_an_existing_secret_is_read_and_no_keys_are_rendered(helm: Helm) -> None:
    docs = helm.template(*STORE, "--set", "modelStore.credentials.existingSecret=mine")
    assert not by_kind(docs, "Secret"), [d["metadata"] for d in by_kind(docs, "Secret")]
    (container,) = named(docs, "Deployment", "t-tidal-model-store")["spec"]["template"]["spec"][
        "containers"
    ]
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {"mine"}


def upload_job(docs: list[Doc]) -> Doc:
    (job,) = by_kind(docs, "Job")
    return job


def test_example_models_job_runs_modelgen_upload_into_the_store_after_install(
    helm: Helm,
) -> None:
    docs = helm.template(*STORE, *UPLOAD, release="tidal")
    job = upload_job(docs)
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == release.image("runtime-cpu")
    command = container["command"]
    assert command[:4] == ["python", "-m", "tidal.runtime.modelgen", "upload"], command
    args = dict(zip(command[4::2], command[5::2], strict=True))
    assert args == {
        "--bucket": "models",
        "--region": "us-east-1",
        "--endpoint": "http://models.tidal-system.svc",
    }, args
    assert "--examples" not in command, "the image holds no checkout: the shipped list is used"
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {
        "tidal-model-store"
    }


def test_example_models_go_to_the_users_own_s3_without_a_store(helm: Helm) -> None:
    docs = helm.template(
        *UPLOAD,
        "--set", "modelStore.external.endpoint=http://minio.storage.svc:9000",
        "--set", "modelStore.external.credentialsSecret=minio-keys",
        "--set", "modelStore.bucket=engines",
    )  # fmt: skip
    assert not by_kind(docs, "PersistentVolumeClaim") and not by_kind(docs, "Secret")
    (container,) = upload_job(docs)["spec"]["template"]["spec"]["containers"]
    args = dict(zip(container["command"][4::2], container["command"][5::2], strict=True))
    assert args["--endpoint"] == "http://minio.storage.svc:9000" and args["--bucket"] == "engines"
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]} == {"minio-keys"}


def test_example_models_to_aws_s3_use_the_pods_identity(helm: Helm) -> None:
    docs = helm.template(*UPLOAD, "--set", "modelStore.bucket=my-models")
    (container,) = upload_job(docs)["spec"]["template"]["spec"]["containers"]
    assert "--endpoint" not in container["command"] and "env" not in container, container


def readme_helm_values() -> list[str]:
    """The ``--set`` arguments of the README's first ``helm install`` (the tested block)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Installing on a real cluster", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "no sh block under 'Installing on a real cluster'"
    joined = block.group(1).replace("\\\n", " ")
    install = next(line for line in joined.splitlines() if line.startswith("helm install"))
    words = shlex.split(install)
    return [words[i + 1] for i, w in enumerate(words) if w == "--set"]


def test_readme_values_install_on_a_cluster_with_a_registry_and_a_default_class(
    helm: Helm,
) -> None:
    values = readme_helm_values()
    assert "modelStore.enabled=true" in values and "modelStore.exampleModels=true" in values, values
    args = [a for v in values for a in ("--set", v)]
    docs = helm.template(*args, release="tidal")
    kinds = {d["kind"] for d in docs}
    assert kinds <= BUILT_IN_KINDS | README_PREREQUISITE_KINDS, kinds - BUILT_IN_KINDS
    wrong: list[str] = []
    for where, spec in pod_specs(docs):
        wrong += [f"{where}: {image}" for image in images(spec) if image not in PUSHED]
        for volume in spec.get("volumes", []):
            if "hostPath" in volume:
                wrong.append(f"{where}: hostPath {volume['hostPath']}")
    assert not wrong, "images not pushed by the release script, or node paths:\n" + "\n".join(wrong)
    for claim in by_kind(docs, "PersistentVolumeClaim"):
        assert "storageClassName" not in claim["spec"], claim  # the cluster's default class
    # The runtime images the operator gives InferenceServices: the CPU one is pushed too.
    operator = named(docs, "Deployment", "tidal")
    env: dict[str, Any] = {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    images_by_backend = dict(
        p.split("=", 1) for p in env["TIDAL_OPERATOR_RUNTIME_IMAGES"].split(",")
    )
    assert images_by_backend["onnxruntime"] in PUSHED, images_by_backend


def test_store_bucket_is_where_the_examples_read() -> None:
    """The examples' engines are s3://<modelStore.bucket>/<model>, read through the store's
    Service, and the Job uploads exactly the models they name."""
    import yaml

    values = yaml.safe_load((REPO / "charts/tidal/values.yaml").read_text())["modelStore"]
    uris, stores = set(), set()
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "InferenceService":
                continue
            stores.add(str(doc["spec"]["runtime"]["storage"]["s3"]))
            uris |= set(re.findall(r"uri: (\S+)", path.read_text()))
    assert stores == {
        str(
            {
                "endpoint": f"http://{values['serviceName']}.tidal-system.svc",
                "credentialsSecret": values["clientSecret"],
            }
        )
    }, stores
    onnx = sorted(u.removeprefix(f"s3://{values['bucket']}/") for u in uris if u.endswith(".onnx"))
    assert onnx == sorted(EXAMPLE_MODELS), onnx


@pytest.mark.parametrize(
    "value", ["modelStore.bucket=Models", "modelStore.external.endpoint=ftp://x"]
)
def test_schema_refuses_a_bad_bucket_or_endpoint(helm: Helm, value: str) -> None:
    result = helm("template", "t", str(REPO / "charts" / "tidal"), "--set", value)
    assert result.returncode != 0 and "modelStore" in result.stderr, result.stderr
