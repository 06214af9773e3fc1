"""Engine naming and selection, the TensorRT plan header, weight-streaming arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.runtime.core.engines import (
    EngineNameError,
    EngineTarget,
    describe_engine,
    engine_file_name,
    select_engine,
)
from tidal.runtime.core.planfile import (
    PlanHeaderError,
    check_plan_compatibility,
    make_plan_header,
    parse_plan_header,
)
from tidal.runtime.core.quantity import Fraction, parse_bytes, parse_bytes_or_fraction
from tidal.runtime.core.weightstreaming import (
    DoesNotFitError,
    EngineMemory,
    plan_weight_streaming,
)


@pytest.mark.parametrize(
    ("uri", "fmt", "arch", "version", "precision", "vc"),
    [
        ("file:///m/r50/sm90-trt11.4-fp16.engine", "plan", "sm90", (11, 4), "fp16", False),
        ("https://x/r50/sm89-trt10.13-vc-int8.plan", "plan", "sm89", (10, 13), "int8", True),
        ("/m/r50/ampere+-trt10.8-fp32.engine", "plan", "ampere+", (10, 8), "fp32", False),
        ("file:///m/resnet50-fp16.onnx", "onnx", None, None, "fp16", False),
        ("file:///m/model.onnx", "onnx", None, None, "fp32", False),
    ],
)
def test_file_names_are_parsed(
    uri: str, fmt: str, arch: str | None, version: tuple[int, int] | None, precision: str, vc: bool
) -> None:
    d = describe_engine(uri)
    assert (d.format, d.gpu_arch, d.trt_version, d.precision, d.version_compatible) == (
        fmt,
        arch,
        version,
        precision,
        vc,
    )


def test_explicit_fields_override_the_file_name() -> None:
    d = describe_engine(
        "file:///m/blob.bin", format="plan", gpu_arch="sm90", trt_version="11.4.1", precision="fp8"
    )
    assert (d.gpu_arch, d.trt_version, d.precision) == ("sm90", (11, 4), "fp8")


@pytest.mark.parametrize("uri", ["file:///m/model.bin", "file:///m/resnet.engine"])
def test_unparseable_names_say_what_the_scheme_is(uri: str) -> None:
    with pytest.raises(EngineNameError, match="engine"):
        describe_engine(uri)


@given(
    st.sampled_from(["sm80", "sm86", "sm89", "sm90", "sm100", "ampere+"]),
    st.tuples(st.integers(8, 12), st.integers(0, 30)),
    st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8"]),
    st.booleans(),
)
def test_engine_file_name_round_trips(
    arch: str, version: tuple[int, int], precision: str, vc: bool
) -> None:
    d = describe_engine("file:///m/" + engine_file_name(arch, version, precision, vc))
    assert (d.gpu_arch, d.trt_version, d.precision, d.version_compatible) == (
        arch,
        version,
        precision,
        vc,
    )


PLANS = [
    describe_engine("file:///m/sm89-trt11.4-fp16.engine"),
    describe_engine("file:///m/sm90-trt11.4-fp32.engine"),
    describe_engine("file:///m/sm90-trt11.4-fp16.engine"),
    describe_engine("file:///m/sm90-trt11.2-vc-fp8.engine"),
    describe_engine("file:///m/sm90-trt10.13-fp8.engine"),
]


@pytest.mark.parametrize(
    ("target", "chosen", "reason"),
    [
        (EngineTarget("plan", "sm90", (11, 4)), "sm90-trt11.4-fp32", "configuration-order"),
        (
            EngineTarget("plan", "sm90", (11, 4), ("fp16", "fp32")),
            "sm90-trt11.4-fp16",
            "precision-preference",
        ),
        (
            EngineTarget("plan", "sm90", (11, 4), ("fp8",)),
            "sm90-trt11.2-vc-fp8",
            "version-compatible",
        ),
        (EngineTarget("plan", "sm89", (11, 4)), "sm89-trt11.4-fp16", "configuration-order"),
        (EngineTarget("plan", "sm80", (11, 4)), None, "no engine fits"),
        (EngineTarget("plan", "sm90", (11, 1), ("fp8",)), None, "no engine fits"),
        (EngineTarget("onnx"), None, "no engine fits"),
    ],
)
def test_select_engine_table(target: EngineTarget, chosen: str | None, reason: str) -> None:
    selection = select_engine(PLANS, target)
    name = (
        selection.chosen.uri.rsplit("/", 1)[-1].removesuffix(".engine")
        if selection.chosen
        else None
    )
    assert name == chosen
    assert reason in selection.reason


def test_every_rejection_says_why() -> None:
    selection = select_engine(PLANS, EngineTarget("plan", "sm90", (11, 4)))
    reasons = {r.uri.rsplit("/", 1)[-1]: r.reason for r in selection.rejected}
    assert "GPU is sm90" in reasons["sm89-trt11.4-fp16.engine"]
    assert "TensorRT 10.13" in reasons["sm90-trt10.13-fp8.engine"]


def test_plan_header_round_trip_and_errors() -> None:
    header = parse_plan_header(make_plan_header((11, 4, 0, 7)) + b"rest of the plan")
    assert header.trt_version == (11, 4, 0, 7)
    with pytest.raises(PlanHeaderError, match="magic tag"):
        parse_plan_header(b"\x08\x01" + bytes(40))  # an ONNX protobuf, not a plan
    with pytest.raises(PlanHeaderError, match="28"):
        parse_plan_header(b"short")


@pytest.mark.parametrize(
    ("built", "running", "vc", "ok"),
    [
        ((11, 4, 0, 7), (11, 4, 0, 7), False, True),
        ((11, 4, 0, 7), (11, 4, 0, 9), False, True),
        ((11, 2, 0, 0), (11, 4, 0, 0), False, False),
        ((11, 2, 0, 0), (11, 4, 0, 0), True, True),
        ((11, 6, 0, 0), (11, 4, 0, 0), True, False),
        ((10, 13, 0, 0), (11, 4, 0, 0), True, False),
    ],
)
def test_plan_compatibility(
    built: tuple[int, int, int, int], running: tuple[int, ...], vc: bool, ok: bool
) -> None:
    result = check_plan_compatibility(parse_plan_header(make_plan_header(built)), running, vc)
    assert result.compatible is ok
    assert result.reason


@pytest.mark.parametrize(
    ("text", "value"),
    [(4096, 4096), ("4096", 4096), ("512Mi", 512 * 2**20), ("20Gi", 20 * 2**30), ("1.5G", 1.5e9)],
)
def test_parse_bytes(text: int | str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["-1", "20 parsecs", "Gi", True, -5])
def test_parse_bytes_rejects_nonsense(text: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)  # type: ignore[arg-type]


def test_percentages_are_fractions() -> None:
    assert parse_bytes_or_fraction("60%") == Fraction(0.6)
    with pytest.raises(ValueError):
        parse_bytes_or_fraction("160%")


MEM = EngineMemory(total_weights=1000, streamable_weights=800, activation=100, scratch=50)


@pytest.mark.parametrize(
    ("requested", "available", "budget", "device", "streaming", "reason"),
    [
        (None, 2000, 800, 1100, False, "resident:all-weights"),
        (Fraction(0.5), 2000, 400, 200 + 400 + 100 + 50, True, "fraction:50%"),
        (300, 2000, 300, 200 + 300 + 100 + 50, True, "bytes"),
        (5000, 2000, 800, 1100, False, "bytes"),
        ("auto", 700, 350, 700, True, "auto:fill-available"),
        (Fraction(1.0), 600, 250, 600, True, "clamped-to-available"),
    ],
)
def test_weight_streaming_budget(
    requested: object, available: int, budget: int, device: int, streaming: bool, reason: str
) -> None:
    plan = plan_weight_streaming(MEM, requested, available)  # type: ignore[arg-type]
    assert (plan.budget_bytes, plan.device_bytes, plan.streaming) == (budget, device, streaming)
    assert reason in plan.reason


def test_weight_streaming_refuses_what_cannot_fit() -> None:
    with pytest.raises(DoesNotFitError, match="at least 350B"):
        plan_weight_streaming(MEM, "auto", 300)
    with pytest.raises(DoesNotFitError, match="weightStreamingBudget"):
        plan_weight_streaming(MEM, None, 1000)


@given(
    st.integers(0, 10**9),
    st.integers(0, 10**9),
    st.integers(0, 10**8),
    st.integers(0, 10**7),
    st.integers(0, 3 * 10**9),
    st.one_of(st.just("auto"), st.integers(0, 10**9), st.floats(0.01, 1).map(Fraction)),
)
def test_weight_streaming_never_exceeds_what_is_available(
    weights: int, streamable: int, activation: int, scratch: int, available: int, requested: object
) -> None:
    memory = EngineMemory(max(weights, streamable), streamable, activation, scratch)
    try:
        plan = plan_weight_streaming(memory, requested, available)  # type: ignore[arg-type]
    except DoesNotFitError:
        return
    assert plan.device_bytes <= available
    assert 0 <= plan.budget_bytes <= memory.streamable_weights
