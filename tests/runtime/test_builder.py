"""The engine builder (tidal.runtime.builder): the accuracy gate and the build key on their own,
then whole builds of a real model on a real data set: an MLP trained on scikit-learn's digits
at test time, exported to ONNX, built as FP32 and INT8 with a representative and a degenerate
calibration set."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tidal.runtime import modelgen
from tidal.runtime.builder.__main__ import main as builder_main
from tidal.runtime.builder.build import (
    ArtifactConflict,
    Destination,
    FetchError,
    GateRefused,
    build,
)
from tidal.runtime.builder.gate import AccuracyMetrics, judge, measure
from tidal.runtime.builder.plan import build_key, differences, key_inputs
from tidal.runtime.builder.spec import (
    BuildSpec,
    BuildSpecError,
    GateSpec,
    ModelError,
    parse_build_spec,
)
from tidal.runtime.config import S3Spec
from tidal.runtime.core.engines import describe_engine
from tidal.runtime.storage import EngineStore, sha256_file
from tidal.sandbox.objectstore import ObjectStore

# -- the gate, pure -----------------------------------------------------------------------------


def metrics(
    agreement: float = 1.0,
    max_err: float = 0.1,
    mean_err: float = 0.01,
    ref_acc: float | None = 0.98,
    cand_acc: float | None = 0.98,
) -> AccuracyMetrics:
    return AccuracyMetrics(450, agreement, max_err, mean_err, ref_acc, cand_acc)


GATE_CASES = [
    # (name, metrics, gate, passed, failed criteria)
    ("all within", metrics(), GateSpec(), True, []),
    ("agreement at the limit passes", metrics(agreement=0.99), GateSpec(), True, []),
    ("agreement below", metrics(agreement=0.95), GateSpec(), False, ["minTop1Agreement"]),
    (
        "accuracy lost",
        metrics(cand_acc=0.95),
        GateSpec(max_accuracy_drop=0.02),
        False,
        ["maxAccuracyDrop"],
    ),
    ("accuracy gained is no loss", metrics(cand_acc=0.99), GateSpec(), True, []),
    ("no labels: accuracy not checked", metrics(ref_acc=None, cand_acc=None), GateSpec(), True, []),
    ("abs error unchecked by default", metrics(max_err=50.0), GateSpec(), True, []),
    ("abs error over", metrics(max_err=0.5), GateSpec(max_abs_error=0.4), False, ["maxAbsError"]),
    (
        "mean error over",
        metrics(mean_err=0.2),
        GateSpec(max_mean_abs_error=0.1),
        False,
        ["maxMeanAbsError"],
    ),
    (
        "every criterion fails",
        metrics(agreement=0.5, max_err=9.0, mean_err=3.0, cand_acc=0.5),
        GateSpec(max_abs_error=1.0, max_mean_abs_error=0.5),
        False,
        ["minTop1Agreement", "maxAccuracyDrop", "maxAbsError", "maxMeanAbsError"],
    ),
    (
        "NaN outputs fail",
        metrics(max_err=math.nan),
        GateSpec(max_abs_error=1.0),
        False,
        ["maxAbsError"],
    ),
]


@pytest.mark.parametrize(
    ("name", "measured", "gate", "passed", "failed"), GATE_CASES, ids=[c[0] for c in GATE_CASES]
)
def test_gate_verdict_names_each_failed_criterion(
    name: str, measured: AccuracyMetrics, gate: GateSpec, passed: bool, failed: list[str]
) -> None:
    verdict = judge(measured, gate)
    assert verdict.passed is passed, f"{name}: {verdict.reason}"
    assert [c.criterion for c in verdict.failed] == failed, f"{name}: {verdict.reason}"
    for criterion in failed:
        assert criterion in verdict.reason, verdict.reason
    assert verdict.reason.startswith("passed: " if passed else "refused: "), verdict.reason


def test_gate_reason_carries_the_numbers() -> None:
    verdict = judge(metrics(agreement=0.5956, cand_acc=0.59), GateSpec())
    assert verdict.reason == (
        "refused: top1Agreement 0.5956 < minTop1Agreement 0.99; "
        "accuracyDrop 0.39 > maxAccuracyDrop 0.01"
    ), verdict.reason
    unlabelled = judge(metrics(ref_acc=None, cand_acc=None), GateSpec())
    assert unlabelled.skipped == ("maxAccuracyDrop: the validation set has no labels",)


def test_measure_counts_top1_agreement_errors_and_labelled_accuracy() -> None:
    reference = np.array([[0.1, 0.9], [0.8, 0.2], [0.4, 0.6], [0.3, 0.7]], dtype=np.float32)
    candidate = np.array([[0.2, 0.8], [0.8, 0.2], [0.7, 0.3], [0.3, 0.7]], dtype=np.float32)
    labels = np.array([1, 0, 1, 0])
    m = measure(reference, candidate, labels)
    assert (m.samples, m.top1_agreement) == (4, 0.75), m
    assert m.max_abs_error == pytest.approx(0.3), m
    assert m.mean_abs_error == pytest.approx((0.1 + 0.1 + 0.3 + 0.3) / 8), m
    assert (m.reference_accuracy, m.candidate_accuracy) == (0.75, 0.5), m
    assert m.accuracy_drop == pytest.approx(0.25), m
    with pytest.raises(ValueError, match="3 labels for 4"):
        measure(reference, candidate, labels[:3])


# -- build keys and specs, pure -----------------------------------------------------------------


def spec_data(tmp: Path, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "model": "digits",
        "version": "1",
        "source": {"uri": str(tmp / "digits.onnx")},
        "precisions": ["fp32", "int8"],
        "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
        "calibration": {"uri": str(tmp / "calibration.npz")},
        "validation": {"uri": str(tmp / "validation.npz"), "labels": "labels"},
        "output": str(tmp / "store"),
    }
    data.update(overrides)
    return data


def key_of(
    spec: BuildSpec,
    precision: str = "int8",
    calibration: str = "b" * 64,
    onnxruntime: str = "1.32.0",
) -> dict[str, Any]:
    return key_inputs(
        spec,
        precision,
        source_sha256="a" * 64,
        calibration_sha256=calibration,
        validation_sha256="c" * 64,
        libraries={"onnxruntime": onnxruntime},
    )


def test_build_key_covers_every_input_and_says_what_changed(tmp_path: Path) -> None:
    spec = parse_build_spec(spec_data(tmp_path))
    base = key_of(spec)
    assert build_key(base) == build_key(key_of(spec))
    changes = {
        "calibration.sha256": key_of(spec, calibration="d" * 64),
        "libraries.onnxruntime": key_of(spec, onnxruntime="1.33.0"),
        "gate.minTop1Agreement": key_of(
            parse_build_spec(spec_data(tmp_path, gate={"minTop1Agreement": 0.95}))
        ),
        "quantization.perChannel": key_of(
            parse_build_spec(spec_data(tmp_path, quantization={"perChannel": True}))
        ),
    }
    for field, changed in changes.items():
        assert build_key(changed) != build_key(base), field
        assert differences(base, changed) == [field], differences(base, changed)
    # the calibration set decides an int8 engine, not an fp32 one
    assert key_of(spec, "fp32") == key_of(spec, "fp32", calibration="d" * 64)


INVALID_SPECS = [
    # (override, the field the message names, what it says)
    ({"calibration": None}, "calibration:", "required when precisions include int8"),
    ({"precisions": []}, "precisions:", "at least 1"),
    ({"precisions": ["fp32", "fp32"]}, "precisions:", "appears twice"),
    ({"precisions": ["fp16"]}, "precisions:", "the onnxruntime builder makes ['fp32', 'int8']"),
    ({"precisions": ["fp4"]}, "precisions.0:", "'fp32', 'int8', 'fp16', 'bf16' or 'fp8'"),
    ({"target": "sm90"}, "target:", "the onnxruntime builder builds for cpu, not sm90"),
    ({"target": "gpu"}, "target:", "the onnxruntime builder builds for cpu, not gpu"),
    ({"target": "sm 90"}, "target:", "pattern"),
    ({"backend": "tflite"}, "backend:", "'onnxruntime', 'torch' or 'tensorrt'"),
    (
        {"backend": "torch", "precisions": ["fp32", "int8"]},
        "precisions:",
        "the torch builder makes ['fp32', 'fp16', 'bf16'], not ['int8']",
    ),
    (
        {"backend": "torch", "target": "sm90", "precisions": ["fp16"], "profiles": []},
        "profiles:",
        "required by the torch",
    ),
    (
        {"profiles": [{"input": "input", "min": [8, 64], "opt": [4, 64], "max": [64, 64]}]},
        "profiles.0:",
        "1 <= min <= opt <= max, got 8, 4, 64",
    ),
    (
        {"profiles": [{"input": "input", "min": [1], "opt": [8, 64], "max": [64, 64]}]},
        "profiles.0:",
        "same rank",
    ),
    ({"gate": {"minTop1Agreemnt": 0.9}}, "gate.minTop1Agreemnt:", "Extra inputs"),
    ({"gate": {"minTop1Agreement": 1.5}}, "gate.minTop1Agreement:", "less than or equal to 1"),
    ({"output": "gs://bucket/x"}, "output:", "expected a local directory or s3://"),
    ({"model": "Digits!"}, "model:", "pattern"),
    ({"source": {"uri": "x.onnx", "sha256": "abc"}}, "source.sha256:", "pattern"),
]


@pytest.mark.parametrize(("override", "field", "says"), INVALID_SPECS)
def test_invalid_specs_name_the_field(
    tmp_path: Path, override: dict[str, Any], field: str, says: str
) -> None:
    data = spec_data(tmp_path, **override)
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(BuildSpecError) as caught:
        parse_build_spec(data)
    message = str(caught.value)
    assert f"  {field}" in message and says in message, message


# -- whole builds on the digits -----------------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained digits MLP as ONNX, its calibration sets (representative: the training digits;
    degenerate: blank images) and the labelled validation set (held-out digits)."""
    return modelgen.write_digits_build_inputs(tmp_path_factory.mktemp("digits"))


def make_spec(digits: Path, out: Path, **overrides: Any) -> Any:
    data = spec_data(digits, output=str(out))
    data.update(overrides)
    return parse_build_spec(data)


def test_representative_calibration_passes_the_gate_and_publishes_both_engines(
    digits: Path, tmp_path: Path
) -> None:
    report = build(make_spec(digits, tmp_path / "store"), tmp_path / "work")
    assert [a.precision for a in report.artifacts] == ["fp32", "int8"]
    assert not report.refused, [a.describe() for a in report.artifacts]
    report.raise_for_refusal()
    int8 = report.artifacts[1].manifest
    accuracy = int8.accuracy
    shown = report.artifacts[1].describe()
    assert accuracy.top1_agreement is not None and accuracy.top1_agreement >= 0.99, shown
    assert accuracy.reference_accuracy is not None and accuracy.reference_accuracy > 0.9, shown
    assert accuracy.accuracy_drop is not None and accuracy.accuracy_drop <= 0.01, shown
    # the naming scheme, and the manifest describing the bytes beside it
    folder = tmp_path / "store" / "digits" / "1" / "cpu" / "int8"
    engine = folder / "digits-int8.onnx"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["published"] is True, manifest
    assert manifest["file"] == {
        "name": "digits-int8.onnx",
        "sha256": sha256_file(engine),
        "sizeBytes": engine.stat().st_size,
        # issue 46: one chunk of 64 MiB here (a small file), its sha256 the whole file's
        "chunkBytes": 64 << 20,
        "chunkSha256": [sha256_file(engine)],
    }
    assert manifest["source"]["sha256"] == sha256_file(digits / "digits.onnx")
    assert manifest["calibration"]["samples"] == 1347, manifest["calibration"]
    assert manifest["validation"]["samples"] == 450, manifest["validation"]
    assert manifest["profiles"] == [
        {"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}
    ]
    assert set(manifest["libraries"]) >= {"onnxruntime", "onnx", "numpy", "tidal"}
    assert (manifest["target"], manifest["precision"], manifest["backend"]) == (
        "cpu",
        "int8",
        "onnxruntime",
    )
    # the runtime's own naming scheme reads the precision from the file name
    assert describe_engine(engine.as_uri()).precision == "int8"
    fp32 = report.artifacts[0].manifest.accuracy
    assert fp32.max_abs_error is not None and fp32.max_abs_error < 1e-4, fp32


def test_degenerate_calibration_fails_the_gate_and_nothing_is_published(
    digits: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = make_spec(digits, tmp_path / "store", calibration={"uri": str(digits / "blank.npz")})
    report = build(spec, tmp_path / "work")
    fp32, int8 = report.artifacts
    assert fp32.published and not int8.published, [a.describe() for a in report.artifacts]
    accuracy = int8.manifest.accuracy
    assert accuracy.top1_agreement is not None and accuracy.top1_agreement < 0.9, accuracy.reason
    assert accuracy.reason.startswith("refused: top1Agreement"), accuracy.reason
    folder = tmp_path / "store" / "digits" / "1" / "cpu" / "int8"
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"], "refused engine written"
    assert json.loads((folder / "manifest.json").read_text())["published"] is False
    assert int8.engine_uri is None
    with pytest.raises(GateRefused, match=r"digits/1 int8 \(refused: top1Agreement 0\.\d+ <"):
        report.raise_for_refusal()

    # the CLI: non-zero, the numbers on stdout, the refusal on stderr
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(by_alias=True, exclude_defaults=True)))
    assert builder_main([str(spec_file), "--work-dir", str(tmp_path / "work")]) == 1
    out, err = capsys.readouterr()
    assert "int8: REFUSED, reused (same build key)" in out, out
    assert "minTop1Agreement 0.99" in out, out
    assert "the accuracy gate refused 1 of 2 engines" in err, err


def test_same_inputs_are_not_rebuilt_and_published_engines_are_not_overwritten(
    digits: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = build(make_spec(digits, store), tmp_path / "work")
    manifests = sorted(store.rglob("manifest.json"))
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    again = build(make_spec(digits, store), tmp_path / "other-work")
    assert [a.reused for a in again.artifacts] == [True, True], [
        a.describe() for a in again.artifacts
    ]
    assert [a.manifest for a in again.artifacts] == [a.manifest for a in first.artifacts]
    after = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    assert after == before, "a reused build rewrote the store"
    assert len(manifests) == 2

    # a published version is immutable: other inputs under the same version are an error
    # naming what changed
    changed = make_spec(digits, store, quantization={"perChannel": True}, precisions=["int8"])
    with pytest.raises(ArtifactConflict, match=r"changed: quantization\.perChannel\)"):
        build(changed, tmp_path / "work")
    # a new version builds
    report = build(
        make_spec(
            digits, store, version="2", precisions=["int8"], quantization={"perChannel": True}
        ),
        tmp_path / "work",
    )
    assert not report.artifacts[0].reused and report.artifacts[0].published, report.artifacts[
        0
    ].describe()


def test_inputs_that_do_not_fit_the_model_name_the_field(digits: Path, tmp_path: Path) -> None:
    out = tmp_path / "store"
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"source": {"uri": str(digits / "missing.onnx")}}, FetchError, "source: "),
        (
            {"source": {"uri": str(digits / "digits.onnx"), "sha256": "0" * 64}},
            FetchError,
            "source: .* sha256",
        ),
        (
            {"profiles": [{"input": "pixels", "min": [1, 64], "opt": [1, 64], "max": [1, 64]}]},
            ModelError,
            r"profiles\[0\]\.input: the model has no input 'pixels' \(its inputs: \['input'\]\)",
        ),
        (
            {"profiles": [{"input": "input", "min": [1, 32], "opt": [1, 32], "max": [1, 32]}]},
            ModelError,
            r"profiles\[0\]: axis 1 of input 'input' is fixed at 64, the profile asks for \[32\]",
        ),
        (
            {"validation": {"uri": str(digits / "validation.npz"), "labels": "classes"}},
            ModelError,
            "validation.labels: the validation set has no array 'classes'",
        ),
        (
            {"validation": {"uri": str(digits / "digits.onnx")}},
            ModelError,
            "validation: not a readable .npz file",
        ),
        ({"gate": {"output": "probabilities"}}, ModelError, "gate.output: the model has no output"),
    ]
    for override, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            build(make_spec(digits, out, **override), tmp_path / "work")
    assert not out.exists() or not any(out.rglob("*.onnx")), "a failed build published an engine"


def test_cli_publishes_and_names_the_field_of_an_invalid_spec(
    digits: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec_data(digits, output=str(tmp_path / "store"))))
    assert builder_main([str(spec_file), "--work-dir", str(tmp_path / "work")]) == 0
    out, _ = capsys.readouterr()
    assert out.count(": published, built in") == 2, out
    bad = spec_data(digits, output=str(tmp_path / "store"))
    del bad["calibration"]
    spec_file.write_text(yaml.safe_dump(bad))
    assert builder_main([str(spec_file)]) == 2
    _, err = capsys.readouterr()
    assert "calibration: Value error, required when precisions include int8" in err, err


def test_cli_takes_an_inline_spec_and_reports_each_verdict_as_json(
    digits: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """How the operator's Jobs run it: the spec inline, the outcome in a report file (the
    container's termination message), refused engines included, within the kubelet's 4096
    bytes; no report when the spec is wrong (the log's tail names the field instead)."""
    data = spec_data(
        digits, output=str(tmp_path / "store"), calibration={"uri": str(digits / "blank.npz")}
    )
    report_file = tmp_path / "report" / "termination-log"
    code = builder_main(["--spec-json", json.dumps(data), "--report", str(report_file)])
    assert code == 1, capsys.readouterr()
    report = json.loads(report_file.read_text())
    assert report["schema"] == "tidal.dev/build-report/v1", report
    fp32, int8 = report["engines"]
    assert (fp32["precision"], fp32["published"], int8["published"]) == ("fp32", True, False)
    assert fp32["uri"].endswith("/digits/1/cpu/fp32/digits-fp32.onnx"), fp32
    assert len(fp32["sha256"]) == 64 and len(int8["buildKey"]) == 64, report
    assert int8["uri"] is None and int8["sha256"] is None, int8
    assert int8["reason"].startswith("refused: top1Agreement"), int8
    assert int8["manifest"].endswith("/digits/1/cpu/int8/manifest.json"), int8

    bad = dict(data, precisions=["int8"], calibration=None)
    other = tmp_path / "bad-report"
    assert builder_main(["--spec-json", json.dumps(bad), "--report", str(other)]) == 2
    assert "calibration: Value error, required" in capsys.readouterr().err
    assert not other.exists(), "a report was written for an invalid spec"
    assert builder_main(["--spec-json", "{not json"]) == 2
    assert "--spec-json is not valid JSON" in capsys.readouterr().err


def test_a_report_is_shortened_to_the_termination_message_limit(
    digits: Path, tmp_path: Path
) -> None:
    from tidal.runtime.builder.__main__ import report_json

    report = build(make_spec(digits, tmp_path / "store"), tmp_path / "work")
    full = report_json(report)
    assert '"reason":"passed: ' in full, full
    short = report_json(report, limit=len(full) - 1)
    assert len(short.encode()) < len(full.encode()), short
    assert json.loads(short)["engines"][0]["sha256"] == report.artifacts[0].manifest.file.sha256
    with pytest.raises(ValueError, match="does not fit 100 bytes"):
        report_json(report, limit=100)


def test_an_s3_output_is_a_store_of_that_bucket_prefix_and_endpoint() -> None:
    """Publishing to s3:// shares the local directory's code path; only the store differs. Its
    construction is checked here (put and get against a real server: the sandbox test below)."""
    destination = Destination.open("s3://engines/team/", S3Spec(endpoint="http://127.0.0.1:9/"))
    store = destination._store
    assert (store.config["bucket"], str(store.prefix)) == ("engines", "team"), store.config
    assert store.config["endpoint"] == "http://127.0.0.1:9", store.config
    assert store.config["virtual_hosted_style_request"] == "false", store.config
    assert store.client_options["allow_http"] == "true", store.client_options
    assert destination.uri("digits/1/cpu/int8/manifest.json") == (
        "s3://engines/team/digits/1/cpu/int8/manifest.json"
    )


@pytest.mark.sandbox
def test_a_build_from_and_to_a_real_s3_server_is_served_by_the_runtime_store(
    s3: ObjectStore, aws_env: None, digits: Path, tmp_path: Path
) -> None:
    """Source, calibration and validation read from versitygw, both engines and their manifests
    published to it, the same build reused from what the store holds, and the published INT8
    engine fetched back, verified, by the runtime's own engine store."""
    for name in ("digits.onnx", "calibration.npz", "validation.npz"):
        s3.put_file("engines", f"inputs/{name}", digits / name)
    spec = parse_build_spec(
        spec_data(
            digits,
            source={"uri": "s3://engines/inputs/digits.onnx"},
            calibration={"uri": "s3://engines/inputs/calibration.npz"},
            validation={"uri": "s3://engines/inputs/validation.npz", "labels": "labels"},
            output="s3://engines/published",
            s3={"endpoint": s3.endpoint},
        )
    )
    report = build(spec, tmp_path / "work")
    shown = [a.describe() for a in report.artifacts]
    assert [(a.precision, a.published, a.reused) for a in report.artifacts] == [
        ("fp32", True, False),
        ("int8", True, False),
    ], shown
    int8 = report.artifacts[1]
    assert int8.engine_uri == "s3://engines/published/digits/1/cpu/int8/digits-int8.onnx", shown
    assert int8.manifest.source.sha256 == sha256_file(digits / "digits.onnx"), shown

    # what the store holds is the manifest the build returned
    import obstore

    client = s3.client("engines")
    held = json.loads(
        bytes(obstore.get(client, "published/digits/1/cpu/int8/manifest.json").bytes())
    )
    assert held["published"] is True and held["file"]["name"] == "digits-int8.onnx", held

    # same inputs: nothing rebuilt, read back from the store
    again = build(spec, tmp_path / "other-work")
    assert [a.reused for a in again.artifacts] == [True, True], [
        a.describe() for a in again.artifacts
    ]

    # the runtime fetches the published engine from S3 and verifies it against the manifest
    fetched = EngineStore(str(tmp_path / "node-cache"), S3Spec(endpoint=s3.endpoint)).fetch(
        int8.engine_uri, held["file"]["sha256"]
    )
    assert fetched.stat().st_size == held["file"]["sizeBytes"], held
    assert describe_engine(int8.engine_uri).precision == "int8"
