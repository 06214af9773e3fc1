"""Shared helpers of the operator tests: example and invalid manifests, a minimal valid spec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INVALID = Path(__file__).resolve().parent / "invalid"
DEGRADED = INVALID / "degraded"
INEFFECTIVE = INVALID / "ineffective"
ACCEPTED = INVALID / "accepted"
# ModelBuilds the API server (and the models) must refuse, naming the field; same headers.
INVALID_BUILDS = INVALID / "build"
# Where the examples fetch their engines: the bucket of the chart's model store
# (spec.runtime.storage.s3 names it and its keys' Secret).
EXAMPLE_MODEL_PREFIX = "s3://models/"


def example_paths(include_gpu: bool = True) -> list[Path]:
    paths = sorted(EXAMPLES.glob("*.yaml"))
    if include_gpu:
        paths += sorted((EXAMPLES / "gpu").glob("*.yaml"))
    return paths


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def invalid_cases(
    directory: Path = INVALID,
) -> list[tuple[Path, dict[str, str], dict[str, Any]]]:
    """(path, header {field, expect, rule[, errors]}, manifest) for each invalid manifest.

    ``invalid/*.yaml`` must be rejected by the API server (and the models);
    ``invalid/degraded/*.yaml`` (``degraded_cases``) pass the schema but cannot work, and must
    turn the service Degraded with a message naming the field.
    """
    cases = []
    for path in sorted(directory.glob("*.yaml")):
        text = path.read_text()
        header = {}
        for line in text.splitlines():
            if not line.startswith("# "):
                break
            key, _, value = line[2:].partition(": ")
            header[key] = value
        cases.append((path, header, dict(yaml.safe_load(text))))
    return cases


def degraded_cases() -> list[tuple[Path, dict[str, str], dict[str, Any]]]:
    """Manifests the API server accepts and the operator reports Degraded (see above)."""
    return invalid_cases(DEGRADED)


def ineffective_cases() -> list[tuple[Path, dict[str, str], dict[str, Any]]]:
    """Manifests that work but hold a setting that can never act as written: the service is
    built and serves, and is reported Degraded (``IneffectiveSetting``) naming the field."""
    return invalid_cases(INEFFECTIVE)


def invalid_build_cases() -> list[tuple[Path, dict[str, str], dict[str, Any]]]:
    """``invalid/build/*.yaml``: ModelBuilds refused at admission, as ``invalid_cases``."""
    return invalid_cases(INVALID_BUILDS)


def accepted_paths() -> list[Path]:
    """Valid manifests at the edges of the rules (whole-byte fractions like 1.5Gi, ...)."""
    return sorted(ACCEPTED.glob("*.yaml"))


def minimal(name: str = "svc", namespace: str = "ns", **spec: Any) -> dict[str, Any]:
    """A valid InferenceService body (as the API server returns it: uid, generation)."""
    body: dict[str, Any] = {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace, "uid": "u-1", "generation": 1},
        "spec": {
            "runtime": {"backend": "onnxruntime"},
            "models": [{"name": "m", "engines": [{"uri": "file:///models/m.onnx"}]}],
        },
    }
    body["spec"].update(spec)
    return body
