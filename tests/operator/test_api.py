"""The API models, the generated CRD, and the invalid-manifest corpus (pydantic side)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from isvc_fixtures import REPO, accepted_paths, example_paths, invalid_cases, load, minimal
from pydantic import ValidationError

from tidal.operator import crdgen
from tidal.operator.core import api


def _all_rules(node: object) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []
    if isinstance(node, dict):
        found += node.get("x-kubernetes-validations", [])
        for value in node.values():
            found += _all_rules(value)
    elif isinstance(node, list):
        for value in node:
            found += _all_rules(value)
    return found


def _schema() -> dict:
    return crdgen.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_models() -> None:
    path = crdgen.crd_path(REPO / "crds")
    assert path.read_text() == crdgen.render(), (
        "crds/ is out of date: run python -m tidal.operator.crdgen crds/"
    )


def test_crd_check_mode_reports_drift(tmp_path: Path) -> None:
    assert crdgen.main(["--check", str(tmp_path)]) == 1
    assert crdgen.main([str(tmp_path)]) == 0
    assert crdgen.main(["--check", str(tmp_path)]) == 0


def test_every_schema_property_has_a_description() -> None:
    missing: list[str] = []

    def walk(node: dict, path: str) -> None:
        for name, prop in node.get("properties", {}).items():
            here = f"{path}.{name}"
            if here != ".metadata" and not prop.get("description"):
                missing.append(here)
            walk(prop, here)
        if "items" in node:
            walk(node["items"], path + "[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + "{}")

    walk(_schema(), "")
    assert missing == []


def test_schema_is_structural() -> None:
    text = yaml.safe_dump(_schema())
    for forbidden in ("$ref", "anyOf", "allOf", "oneOf", "additionalProperties: false", "null"):
        assert forbidden not in text


def test_crd_has_subresources_columns_and_short_name() -> None:
    version = crdgen.build_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert version["subresources"]["status"] == {}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Ready", "Replicas", "P99", "Pool", "Age"} <= set(names)
    assert crdgen.build_crd()["spec"]["names"]["shortNames"] == ["tisvc"]


def test_defaults_match_between_models_and_schema() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    scaling = spec["autoscaling"]["properties"]
    defaults = api.Autoscaling()
    assert scaling["minReplicas"]["default"] == defaults.min_replicas
    assert scaling["maxReplicas"]["default"] == defaults.max_replicas
    assert spec["autoscaling"]["default"] == defaults.to_wire()
    assert spec["rollout"]["properties"]["steps"]["default"] == [25, 50, 100]


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_examples_parse(path: Path) -> None:
    isvc = api.parse_inference_service(load(path))
    assert isvc.spec.models


# The digests of what people type when a hash is required and they have none: an example that
# carries one fails its own check (sha256 mismatch) for everyone who copies it.
PLACEHOLDER_DIGESTS = {
    hashlib.sha256(text.encode()).hexdigest()
    for text in ("", "test", "test\n", "foo", "hello", "hello world", "x", "engine", "model")
} | {digit * 64 for digit in "0123456789abcdef"}


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_examples_carry_no_placeholder_hashes(path: Path) -> None:
    isvc = api.parse_inference_service(load(path))
    for model in isvc.spec.models:
        for engine in model.engines or []:
            assert engine.sha256 not in PLACEHOLDER_DIGESTS, (
                f"{path.name}: model {model.name} engine {engine.uri} carries a placeholder "
                f"sha256 {engine.sha256}; give the real file's digest or none"
            )


@pytest.mark.parametrize("path", accepted_paths(), ids=lambda p: p.stem)
def test_edge_values_are_accepted_by_the_models(path: Path) -> None:
    isvc = api.parse_inference_service(load(path))
    assert isvc.spec.models[0].memory == "1.5Gi"


@pytest.mark.parametrize(
    ("path", "header", "manifest"), invalid_cases(), ids=lambda v: getattr(v, "stem", "")
)
def test_invalid_manifest_is_rejected_by_the_models(
    path: Path, header: dict[str, str], manifest: dict
) -> None:
    with pytest.raises(ValidationError) as caught:
        api.parse_inference_service(manifest)
    text = api.format_validation_error(caught.value)
    leaf = header["field"].rsplit(".", 1)[-1].split("[")[0]
    assert leaf in text, f"{path.name}: error does not name {leaf}: {text}"
    rule_messages = {r["message"] for r in _all_rules(_schema())}
    if header["expect"] in rule_messages or any(
        m.startswith(header["expect"]) for m in rule_messages
    ):
        assert header["expect"] in text


def test_invalid_corpus_covers_every_cel_rule() -> None:
    expected = {h["expect"] for _, h, _ in invalid_cases()}
    uncovered = [
        r["message"]
        for r in _all_rules(_schema())
        if not any(r["message"].startswith(e) for e in expected)
    ]
    assert uncovered == []
    assert len(invalid_cases()) >= 20


def test_invalid_corpus_headers_are_complete() -> None:
    for path, header, _ in invalid_cases():
        assert {"field", "expect", "rule"} <= set(header), path.name


@pytest.mark.parametrize(
    ("value", "expected"),
    [("20Gi", 20 * 2**30), ("512Mi", 512 * 2**20), ("1.5G", 1_500_000_000), ("0", 0)],
)
def test_quantity_bytes(value: str, expected: int) -> None:
    assert api.quantity_bytes(value) == expected


@pytest.mark.parametrize(("value", "seconds"), [("60s", 60), ("1m30s", 90), ("500ms", 0.5)])
def test_duration_seconds(value: str, seconds: float) -> None:
    assert api.duration_seconds(value) == seconds


def test_gpus_default_follows_backend() -> None:
    assert api.Runtime(backend=api.Backend.TENSORRT).gpu_count == 1
    assert api.Runtime(backend=api.Backend.ONNXRUNTIME).gpu_count == 0


def test_engine_backend_is_inferred_from_the_file_name() -> None:
    assert api.Engine(uri="file:///m/a.onnx").effective_backend is api.Backend.ONNXRUNTIME
    plan = api.Engine(uri="s3://b/sm90-trt11.4-fp16.engine")
    assert plan.effective_backend is api.Backend.TENSORRT


def test_wire_round_trip_keeps_camel_case() -> None:
    isvc = api.parse_inference_service(minimal(autoscaling={"minReplicas": 2}))
    wire = isvc.spec.to_wire()
    assert wire["autoscaling"]["minReplicas"] == 2
    assert api.InferenceServiceSpec.model_validate(wire) == isvc.spec


def _unbounded(node: dict, path: str) -> list[str]:
    """Paths of strings without a length bound, numbers without a range, lists and maps
    without a size bound."""
    found: list[str] = []
    kind = node.get("type")
    if kind == "string" and "maxLength" not in node and "enum" not in node:
        found.append(path)
    if kind in ("integer", "number") and not ("minimum" in node and "maximum" in node):
        found.append(path)
    if kind == "array" and "maxItems" not in node:
        found.append(path)
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        if "maxProperties" not in node:
            found.append(path)
        found += _unbounded(node["additionalProperties"], path + "{}")
    for name, prop in node.get("properties", {}).items():
        found += _unbounded(prop, f"{path}.{name}")
    if "items" in node:
        found += _unbounded(node["items"], path + "[]")
    return found


def test_every_user_facing_value_of_the_spec_is_bounded() -> None:
    root = _schema()
    assert _unbounded(root["properties"]["spec"], "spec") == []
    assert _unbounded(root["properties"]["metadata"], "metadata") == []


@pytest.mark.parametrize(
    ("value", "whole"),
    [
        ("20Gi", True),
        ("1.5G", True),
        ("1.5Ki", True),
        ("0", True),
        ("500m", False),
        ("1000m", True),
        ("0.5", False),
        ("1.0001k", False),
        ("9Ei", False),
        ("7Ei", True),
        ("x", False),
    ],
)
def test_whole_bytes_agrees_with_the_cel_rule(value: str, whole: bool) -> None:
    assert api.is_whole_bytes(value) is whole


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi"]),
)
def test_quantities_compare_by_their_exact_value(number: int, unit: str) -> None:
    value = f"{number}{unit}"
    assert api.quantity_cmp(value, value) == 0
    assert api.quantity_cmp(value, f"{number + 1}{unit}") == -1
    assert api.quantity_bytes(value) == number * int(api._UNITS[unit])
    assert api.is_whole_bytes(value)


def test_baseline_runtime_schema_is_the_runtime_schema_without_defaults() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    runtime = spec["runtime"]["properties"]
    override = spec["rollout"]["properties"]["baseline"]["properties"]["runtime"]["properties"]
    assert set(override) == set(runtime)
    for name, prop in override.items():
        assert "default" not in prop, name
        assert prop == {k: v for k, v in runtime[name].items() if k != "default"}, name
