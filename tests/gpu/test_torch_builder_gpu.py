"""The torch (AOTInductor) builder on a real CUDA GPU: what it published loads in the runtime and
computes what the FP32 source computes; the same spec again rebuilds nothing; a spec for
another GPU is refused naming the field.

The builds come from the ``built`` fixture (tests/gpu/conftest.py): ``$TIDAL_TORCH_BUILDS``, as
bench/gpu_device_run.sh with MODE=torch-build fills it, or made on first use.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal.common.clock import CLOCK
from tidal.runtime.backends.torch_aoti import why_no_cuda
from tidal.runtime.builder.build import build
from tidal.runtime.builder.plan import Manifest
from tidal.runtime.builder.spec import ModelError, parse_build_spec
from tidal.runtime.config import parse_config
from tidal.runtime.enginecache import EngineCache
from tidal.runtime.metrics import RuntimeMetrics
from tidal.runtime.storage import EngineStore, sha256_file

WHY_NO_GPU = why_no_cuda()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NO_GPU is not None, reason=str(WHY_NO_GPU))]
ROOT = Path(__file__).resolve().parents[2]


def published(built: Path) -> list[tuple[Manifest, Path]]:
    found = []
    for manifest_file in sorted((built / "published").glob("*/1/*/*/manifest.json")):
        manifest = Manifest.model_validate_json(manifest_file.read_text())
        if manifest.published:
            found.append((manifest, manifest_file.parent / manifest.file.name))
    return found


def test_published_packages_serve_what_the_fp32_source_computes(built: Path) -> None:
    """Each published package, configured by URI alone (precision, GPU and torch read from its
    name) with the manifest's sha256, goes through the runtime's engine cache and agrees with
    the FP32 source on the validation set as its manifest says."""
    import torch

    from tidal.runtime.backends.torch_aoti import TorchAOTIBackend

    packages = published(built)
    assert packages, f"nothing published under {built}"
    backend = TorchAOTIBackend(0)
    for manifest, path in packages:
        config = parse_config(
            {
                "models": [
                    {
                        "name": manifest.model,
                        "engines": [{"uri": str(path), "sha256": manifest.file.sha256}],
                        "maxBatchSize": manifest.profiles[0].max[0],
                        "precisions": [manifest.precision],
                        "preload": False,
                    }
                ],
                "memory": {"engineCacheBudgetBytes": 8 << 30},
            }
        )
        cache = EngineCache(config, backend, EngineStore(None), RuntimeMetrics(), CLOCK)

        async def load(cache: EngineCache = cache, name: str = manifest.model) -> Any:
            engine, _ = await cache.acquire(name)
            cache.release(name)
            return engine

        engine = asyncio.run(load())
        folder = built / manifest.model
        x = np.load(folder / "validation.npz")["input"][:64]
        got = engine.infer({"input": x})["output"]
        source = torch.export.load(str(folder / "source.pt2")).module()
        with torch.no_grad():
            want = source(torch.from_numpy(x)).numpy()
        assert got.dtype == np.float32 and got.shape == want.shape, manifest.precision
        agreement = float((got.argmax(1) == want.argmax(1)).mean())
        assert agreement >= manifest.accuracy.gate.min_top1_agreement - 1 / 64, (
            manifest.model,
            manifest.precision,
            agreement,
        )
        assert sha256_file(path) == manifest.file.sha256
        cache.close()
    backend.close()


def test_the_same_spec_again_rebuilds_nothing(built: Path, tmp_path: Path) -> None:
    """Every precision that has a manifest (published or refused), built again: all reused."""
    data = json.loads((built / "small" / "spec.json").read_text())
    data["precisions"] = [
        p
        for p in data["precisions"]
        if (built / "published" / "small" / "1" / data["target"] / p / "manifest.json").is_file()
    ]
    assert data["precisions"], "nothing was built"
    spec = parse_build_spec(data)
    before = {p: p.stat().st_mtime_ns for p in (built / "published").rglob("*") if p.is_file()}
    report = build(spec, tmp_path / "work")
    assert [a.reused for a in report.artifacts] == [True] * len(report.artifacts), [
        a.describe() for a in report.artifacts
    ]
    after = {p: p.stat().st_mtime_ns for p in (built / "published").rglob("*") if p.is_file()}
    assert after == before


def test_a_spec_for_another_gpu_is_refused_naming_the_field(built: Path, tmp_path: Path) -> None:
    data = json.loads((built / "small" / "spec.json").read_text())
    data.update(target="sm80" if data["target"] != "sm80" else "sm90", output=str(tmp_path))
    with pytest.raises(ModelError, match=r"^target: sm\d+ asked, this machine's GPU"):
        build(parse_build_spec(data), tmp_path / "work")
    assert not list(tmp_path.glob("**/*.pt2"))


def test_reduced_precisions_keep_the_source_interface(built: Path) -> None:
    """fp16/bf16 (and fp8 where the GPU has float8 products) take and return float32, as the
    FP32 source does, and stay close to it."""
    import torch

    from tidal.runtime.builder.aoti import TorchAOTIMaker

    data = json.loads((built / "small" / "spec.json").read_text())
    data["precisions"] = ["fp32"]
    maker = TorchAOTIMaker(parse_build_spec(data))
    program = maker.open_source(built / "small" / "source.pt2")
    x = torch.from_numpy(np.load(built / "small" / "validation.npz")["input"][:32]).cuda()
    with torch.no_grad():
        want = program.module()(x)
        precisions = ["fp16", "bf16"]
        if torch.cuda.get_device_capability() >= (8, 9):
            precisions.append("fp8")
        for precision in precisions:
            got = maker.precision_module(precision)(x)
            assert got.dtype == torch.float32, precision
            agreement = float((got.argmax(1) == want.argmax(1)).float().mean())
            assert agreement >= 0.9, (precision, agreement)
    maker.close()
