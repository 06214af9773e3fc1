"""One source of truth for names and versions (``tidal.common.release``): the publishing
workflow, the chart, the CRD and the operator's defaults, the Dockerfiles, pyproject and every
image the docs and examples name agree with it. Any two that disagree fail here."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml
from chart_helpers import CHART, REPO, Helm, env_of, one

from tidal.common import release
from tidal.operator.__main__ import parse_args
from tidal.operator.core.api import Backend
from tidal.operator.core.images import DEFAULT_RUNTIME_IMAGES
from tidal.runtime.config import RuntimeConfig

WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
CRD = REPO / "crds" / "inferenceservices.serving.tidal.dev.yaml"
# An image under ghcr.io: owner/name[:tag], not a deeper path (the chart's oci://…/charts/tidal).
PUBLISHED = re.compile(
    r"ghcr\.io/[A-Za-z0-9._-]+/[A-Za-z0-9._-]+(?![A-Za-z0-9._/-])(?::[A-Za-z0-9._-]+)?"
)


def label(dockerfile: Path, key: str) -> str | None:
    found = re.search(rf'{re.escape(key)}="([^"]*)"', dockerfile.read_text())
    return found.group(1) if found else None


def runtime_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"]["properties"]["runtime"])


def test_versions_agree_pyproject_chart_and_release() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert project["version"] == release.VERSION, "pyproject.toml's version"
    assert chart["appVersion"] == release.VERSION, "Chart.yaml's appVersion"


def test_chart_defaults_are_the_release_images(helm: Helm) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == release.image("operator").rsplit(":", 1)[0]
    assert set(values["runtimeImages"]) == set(release.BACKEND_IMAGES)
    assert (
        values["modelStore"]["image"]["repository"] == release.image("modelstore").rsplit(":", 1)[0]
    )
    docs = helm.template()
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == release.image("operator")
    # The operator, configured by the chart's env, gives each backend the release's image: the
    # same as its own built-in default.
    args = parse_args([], env_of(container))
    expected = {Backend(b): ref for b, ref in release.default_runtime_images().items()}
    assert args.runtime_images == expected == DEFAULT_RUNTIME_IMAGES


def test_chart_runtime_images_reach_the_operator(helm: Helm) -> None:
    docs = helm.template(
        "--set", "runtimeImages.onnxruntime.repository=registry.example.com/cpu",
        "--set", "runtimeImages.tensorrt.tag=9.9.9",
    )  # fmt: skip
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    images = parse_args([], env_of(container)).runtime_images
    assert images[Backend.ONNXRUNTIME] == f"registry.example.com/cpu:{release.VERSION}", images
    assert images[Backend.TENSORRT] == release.image("runtime", version="9.9.9"), images


def test_crd_names_no_image_and_offers_every_backend_with_an_image() -> None:
    runtime = runtime_schema()
    props = runtime["properties"]
    # No image default in the CRD: the operator picks the backend's (an ONNX model never gets
    # the TensorRT image).
    assert "default" not in props["image"], props["image"]
    assert "image" not in runtime.get("default", {}), runtime.get("default")
    assert (
        set(props["backend"]["enum"]) == set(release.BACKEND_IMAGES) == {b.value for b in Backend}
    )


def test_default_backend_is_the_runtime_s() -> None:
    runtime = runtime_schema()
    default = RuntimeConfig.model_fields["backend"].default
    assert runtime["properties"]["backend"]["default"] == default, "CRD vs tidal-runtime"
    assert runtime["default"]["backend"] == default


def test_dockerfiles_label_and_document_the_release_names() -> None:
    for kind, name in release.IMAGES.items():
        dockerfile = REPO / "images" / f"{kind}.Dockerfile"
        assert label(dockerfile, "org.opencontainers.image.title") == name, dockerfile
        assert label(dockerfile, "org.opencontainers.image.version") == release.VERSION, dockerfile
        built = re.findall(r"docker build -f \S+ -t (\S+) ", dockerfile.read_text())
        assert built == [release.image(kind)], f"{dockerfile}: build comment tags {built}"


def test_workflow_publishes_the_release_names() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["build"]
    assert set(job["strategy"]["matrix"]["image"]) == set(release.IMAGES)
    meta = next(s for s in job["steps"] if s.get("id") == "meta")
    template = meta["with"]["images"]
    owner = release.REGISTRY.split("/", 1)[1]
    for kind in release.IMAGES:
        # What the workflow's release step prints for the kind, run the way it runs it.
        name = subprocess.run(
            [sys.executable, "-m", "tidal.common.release", "name", kind],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        published = template.replace("${{ github.repository_owner }}", owner).replace(
            "${{ steps.release.outputs.name }}", name
        )
        assert published == release.image(kind).rsplit(":", 1)[0], (kind, template)
    checks = next(s for s in job["steps"] if s.get("id") == "release")["run"]
    assert "tidal.common.release version" in checks and '"v${version}"' in checks, checks


def test_every_published_image_named_anywhere_is_a_release_image() -> None:
    names = {release.image(kind).rsplit(":", 1)[0] for kind in release.IMAGES}
    files = [
        REPO / "README.md",
        *(REPO / "charts").rglob("*.md"),
        *(REPO / "charts").rglob("*.yaml"),
        *(REPO / "examples").rglob("*.yaml"),
        *(REPO / "examples").rglob("*.md"),
        *(REPO / "images").glob("*.Dockerfile"),
        *(REPO / "operator").rglob("*.md"),
        *(REPO / "runtime").rglob("*.md"),
        *(REPO / "gateway").rglob("*.md"),
        *(REPO / "e2e" / "sandbox").glob("*.py"),
    ]
    wrong = [
        f"{path.relative_to(REPO)}: {ref}"
        for path in files
        for ref in PUBLISHED.findall(path.read_text())
        if ref.split(":", 1)[0] not in names
    ]
    assert not wrong, "images not named by tidal.common.release:\n" + "\n".join(wrong)


def test_readme_offers_only_the_backends_an_inferenceservice_has() -> None:
    """The README's component table must not advertise a backend the CRD's enum lacks as one an
    InferenceService can use (torch runs only under tidal-runtime started by hand)."""
    row = next(
        line for line in (REPO / "README.md").read_text().splitlines() if "`tidal.runtime`" in line
    )
    offered = set(re.findall(r"TensorRT|ONNX Runtime|PyTorch", row.split(" backends", 1)[0]))
    crd_names = {"tensorrt": "TensorRT", "onnxruntime": "ONNX Runtime"}
    assert offered == {crd_names[b] for b in runtime_schema()["properties"]["backend"]["enum"]}, row
    if "PyTorch" in row:
        assert "not yet from an InferenceService" in row, row


def test_chart_comments_describe_the_default_leader_election() -> None:
    values = (CHART / "values.yaml").read_text()
    elected = yaml.safe_load(values)["operator"]["leaderElection"]["enabled"]
    # Recreate (one operator at a time) is the strategy only without election.
    stale = [
        line for line in values.splitlines() if "Recreate" in line or "no leader election" in line
    ]
    assert not (elected and stale), stale
