"""The torch (AOTInductor) backend's GPU-free parts: naming, version binding, package layout,
the cache budget against device memory.  No torch and no GPU needed (CI has neither); the
parts that need them are in tests/gpu/."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.common.clock import CLOCK
from tidal.runtime.backends import DeviceMemory, TensorSpec
from tidal.runtime.backends.torch_aoti import (
    LOAD_HEADROOM_BYTES,
    Pt2Manifest,
    fits_free_memory,
    footprint_bytes,
    parse_manifest,
    read_into,
    read_tidal_section,
)
from tidal.runtime.builder.pt2 import (
    ALIGN,
    add_tidal_section,
    layout_constants,
    manifest_to_json,
)
from tidal.runtime.config import parse_config
from tidal.runtime.core.engines import (
    EngineNameError,
    EngineTarget,
    describe_engine,
    parse_torch_version,
    plan_cache_budget,
    pt2_file_name,
    select_engine,
)
from tidal.runtime.enginecache import EngineCache
from tidal.runtime.errors import EngineLoadError
from tidal.runtime.metrics import RuntimeMetrics
from tidal.runtime.storage import EngineStore

HOPPER = EngineTarget(format="pt2", gpu_arch="sm90", torch_version=(2, 11))


@pytest.mark.parametrize(
    ("uri", "arch", "version", "precision"),
    [
        ("file:///m/r50/sm90-torch2.11-fp16.pt2", "sm90", (2, 11), "fp16"),
        ("https://x/m/sm100-torch2.12-bf16.pt2", "sm100", (2, 12), "bf16"),
        ("/m/cpu-torch2.11-fp32.pt2", "cpu", (2, 11), "fp32"),
    ],
)
def test_pt2_names_are_parsed(
    uri: str, arch: str, version: tuple[int, int], precision: str
) -> None:
    d = describe_engine(uri)
    assert (d.format, d.gpu_arch, d.torch_version, d.precision) == (
        "pt2",
        arch,
        version,
        precision,
    )


@pytest.mark.parametrize("name", ["model.pt2", "sm90-trt11.4-fp16.pt2", "sm90-torch2-fp16.pt2"])
def test_a_pt2_name_without_arch_and_version_is_refused(name: str) -> None:
    with pytest.raises(EngineNameError, match=r"torch<major>\.<minor>"):
        describe_engine(f"file:///m/{name}")


@given(
    st.sampled_from(["sm80", "sm90", "sm100", "cpu"]),
    st.tuples(st.integers(1, 9), st.integers(0, 40)),
    st.sampled_from(["fp32", "fp16", "bf16", "int8"]),
)
def test_pt2_file_name_round_trips(arch: str, version: tuple[int, int], precision: str) -> None:
    d = describe_engine("/m/" + pt2_file_name(arch, version, precision))
    assert (d.gpu_arch, d.torch_version, d.precision) == (arch, version, precision)


@pytest.mark.parametrize(
    ("text", "version"), [("2.11.0+cu130", (2, 11)), ("2.11", (2, 11)), ("torch2.9.1", (2, 9))]
)
def test_torch_versions_are_read_as_major_minor(text: str, version: tuple[int, int]) -> None:
    assert parse_torch_version(text) == version


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("sm80-torch2.11-fp16.pt2", "compiled for sm80 but this runtime runs on sm90"),
        ("cpu-torch2.11-fp32.pt2", "compiled for cpu but this runtime runs on sm90"),
        ("sm90-torch2.10-fp16.pt2", "compiled by torch 2.10 but this runtime is torch 2.11"),
        ("sm90-trt11.4-fp16.engine", "format plan but the backend runs pt2"),
    ],
)
def test_a_package_for_another_gpu_or_torch_is_rejected_with_the_reason(
    name: str, reason: str
) -> None:
    selection = select_engine([describe_engine(f"/m/{name}")], HOPPER)
    assert selection.chosen is None
    assert reason in selection.rejected[0].reason


def test_the_package_for_this_gpu_and_torch_is_selected() -> None:
    engines = [
        describe_engine(f"/m/{n}") for n in ("sm80-torch2.11-fp16.pt2", "sm90-torch2.11-fp16.pt2")
    ]
    selection = select_engine(engines, HOPPER)
    assert selection.chosen is not None and selection.chosen.uri == "/m/sm90-torch2.11-fp16.pt2"
    assert [r.uri for r in selection.rejected] == ["/m/sm80-torch2.11-fp16.pt2"]


@pytest.mark.parametrize(
    ("configured", "reserve", "free", "expected", "reason"),
    [
        (8 << 30, 0, None, 8 << 30, "configured"),
        (8 << 30, 1 << 30, None, 7 << 30, "configured"),
        (8 << 30, 1 << 30, 100 << 30, 7 << 30, "configured"),
        (200 << 30, 1 << 30, 100 << 30, 99 << 30, "device-free"),
        (8 << 30, 2 << 30, 1 << 30, 0, "device-free"),
    ],
)
def test_the_cache_budget_is_capped_by_free_device_memory(
    configured: int, reserve: int, free: int | None, expected: int, reason: str
) -> None:
    budget = plan_cache_budget(configured, reserve, free)
    assert budget.bytes == expected
    assert budget.reason.startswith(reason)


class DeviceOnlyBackend:
    """A backend that reports device memory and loads nothing."""

    name = "fake-gpu"

    def __init__(self, total: int, used: int) -> None:
        self.memory = DeviceMemory(total_bytes=total, used_bytes=used)

    def target(self, model: object) -> EngineTarget:
        return HOPPER

    def estimate_bytes(self, path: Path, descriptor: object) -> int:
        return 0

    def load(self, path: Path, descriptor: object, model: object, available_bytes: int) -> Any:
        raise EngineLoadError("nothing loads here")

    def device_memory(self) -> DeviceMemory | None:
        return self.memory


def test_the_engine_cache_takes_its_budget_from_the_device() -> None:
    config = parse_config(
        {"memory": {"engineCacheBudgetBytes": 100 << 30, "reserveBytes": 1 << 30}}
    )
    cache = EngineCache(
        config, DeviceOnlyBackend(140 << 30, 60 << 30), EngineStore(None), RuntimeMetrics(), CLOCK
    )
    assert cache.budget == 79 << 30
    assert cache.budget_plan.reason.startswith("device-free:85899345920B free")
    cache.close()


def test_constants_are_laid_out_aligned_and_disjoint() -> None:
    layout, total = layout_constants(
        [("a", "float16", (3,), 6), ("b", "float32", (100,), 400), ("c", "float16", (1,), 2)]
    )
    # 6 B take one aligned slot, 400 B two; each constant starts on an ALIGN boundary
    assert [c.offset for c in layout] == [0, ALIGN, 3 * ALIGN]
    assert total == 4 * ALIGN


def manifest_of(arrays: dict[str, np.ndarray[Any, Any]]) -> Pt2Manifest:
    layout, total = layout_constants(
        [(n, str(a.dtype), a.shape, a.nbytes) for n, a in arrays.items()]
    )
    return Pt2Manifest(
        inputs=(TensorSpec("x", "FP16", (-1, 4)),),
        outputs=(TensorSpec("y", "FP16", (-1, 2)),),
        constants=layout,
        weights_bytes=total,
        device="cuda",
        torch_version="2.11.0+cu130",
    )


def fake_package(
    tmp_path: Path, arrays: dict[str, np.ndarray[Any, Any]]
) -> tuple[Path, Pt2Manifest]:
    """A zip shaped like a PT2 archive (no compiled model) with a tidal section appended."""
    path = tmp_path / "sm90-torch2.11-fp16.pt2"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr("model/data/aotinductor/model/x.wrapper.so", b"\0" * 1000)
    manifest = manifest_of(arrays)
    add_tidal_section(path, manifest, [a.tobytes() for a in arrays.values()])
    return path, manifest


def test_the_tidal_section_is_found_and_its_weights_read_in_place(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "l1.weight": rng.standard_normal((4, 8)).astype(np.float16),
        "l1.bias": rng.standard_normal((8,)).astype(np.float32),
    }
    path, manifest = fake_package(tmp_path, arrays)
    section = read_tidal_section(path)
    assert section.manifest == manifest
    blob = bytearray(manifest.weights_bytes)
    read_into(path, section.weights_offset, memoryview(blob), threads=3)
    for entry, array in zip(manifest.constants, arrays.values(), strict=True):
        raw = bytes(blob[entry.offset : entry.offset + entry.nbytes])
        np.testing.assert_array_equal(np.frombuffer(raw, entry.dtype).reshape(entry.shape), array)


def test_parallel_reads_fill_every_chunk(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 255, 3 * 4096 + 17, dtype=np.uint8)
    path = tmp_path / "blob"
    path.write_bytes(b"head" + data.tobytes())
    import tidal.runtime.backends.torch_aoti as aoti

    target = bytearray(data.size)
    chunk, aoti.STAGE_CHUNK = aoti.STAGE_CHUNK, 4096
    try:
        read_into(path, 4, memoryview(target), threads=4)
    finally:
        aoti.STAGE_CHUNK = chunk
    assert bytes(target) == data.tobytes()


def test_a_file_that_is_not_a_tidal_package_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sm90-torch2.11-fp16.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
    with pytest.raises(EngineLoadError, match="not a tidal AOTInductor package"):
        read_tidal_section(path)
    path.write_bytes(b"not a zip at all")
    with pytest.raises(EngineLoadError, match="not a tidal AOTInductor package"):
        read_tidal_section(path)


def test_a_manifest_whose_constants_overlap_is_refused() -> None:
    manifest = manifest_of({"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)})
    text = manifest_to_json(manifest).replace('"offset": 256', '"offset": 8')
    with pytest.raises(EngineLoadError, match="overlaps"):
        parse_manifest(text)
    with pytest.raises(EngineLoadError, match="does not match its shape"):
        parse_manifest(manifest_to_json(manifest).replace('"nbytes": 16', '"nbytes": 12', 1))


def test_an_engine_is_accounted_with_its_workspace_and_refused_without_room() -> None:
    assert footprint_bytes(1000, 24, 300) == 1324
    assert fits_free_memory(1 << 30, (1 << 30) + LOAD_HEADROOM_BYTES) is None
    why = fits_free_memory(1 << 30, 1 << 30)
    assert why is not None and "the device has 1073741824B free" in why
