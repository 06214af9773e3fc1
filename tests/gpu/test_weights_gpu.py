"""Issue 46 on a real GPU: staging a file to the device by chunks, and weight streaming.

Staging: the bytes on the device equal the file's region, whichever chunking; a corrupted chunk
is refused by name; one whole-file sha256 still verifies.  Streaming: a model whose weights
exceed its budget gives the resident model's outputs exactly (same kernels, same order), and
its device memory at the peak (weights resident + two slots + activations) stays within the
budget the plan was made for.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidal.runtime.backends import staging
from tidal.runtime.backends.torch_aoti import why_no_cuda
from tidal.runtime.core.weightstreaming import plan_layer_residency

WHY_NO_GPU = why_no_cuda()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NO_GPU is not None, reason=str(WHY_NO_GPU))]
MiB = 1 << 20


@pytest.fixture(scope="module")
def torch() -> Any:
    import torch

    return torch


@pytest.fixture(scope="module")
def ring(torch: Any) -> Any:
    return staging.PinnedRing(torch, buffers=3, chunk_bytes=MiB)


def write_file(path: Path, nbytes: int) -> bytes:
    data = np.random.default_rng(46).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("offset,length", [(0, 10 * MiB + 7), (12345, 5 * MiB), (3 * MiB, 1)])
def test_staged_bytes_equal_the_files_region(
    torch: Any, ring: Any, tmp_path: Path, offset: int, length: int
) -> None:
    data = write_file(tmp_path / "f.bin", 11 * MiB)
    digests = staging.chunk_sha256_file(tmp_path / "f.bin", chunk_bytes=MiB)
    target = torch.empty(length, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    report = staging.stage_to_device(
        torch, tmp_path / "f.bin", offset, target, ring, stream, digests=digests, threads=4
    )
    got = target.cpu().numpy().tobytes()
    assert got == data[offset : offset + length], (
        f"staged bytes differ from the file at offset {offset}, length {length}: {report}"
    )
    assert report.copied_bytes == length, report


def test_a_corrupted_chunk_is_refused_by_name(torch: Any, ring: Any, tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = bytearray(write_file(path, 6 * MiB))
    digests = staging.chunk_sha256_file(path, chunk_bytes=MiB)
    data[4 * MiB + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    target = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    with pytest.raises(staging.StagingError, match="chunk 4 "):
        staging.stage_to_device(
            torch, path, 0, target, ring, torch.cuda.Stream(), digests=digests, threads=4
        )


def test_one_whole_file_sha256_still_verifies(torch: Any, ring: Any, tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    data = write_file(path, 4 * MiB + 3)
    target = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    good = hashlib.sha256(data).hexdigest()
    report = staging.stage_to_device(
        torch, path, MiB, target, ring, torch.cuda.Stream(), whole_sha256=good, threads=2
    )
    assert report.read_bytes == len(data), f"the whole file must be read to hash it: {report}"
    with pytest.raises(staging.StagingError, match="expected"):
        staging.stage_to_device(
            torch, path, MiB, target, ring, torch.cuda.Stream(), whole_sha256="0" * 64
        )


def make_layers(torch: Any, count: int, dim: int) -> list[Any]:
    torch.manual_seed(46)
    return [
        torch.nn.Sequential(
            torch.nn.Linear(dim, dim, dtype=torch.float16),
            torch.nn.LayerNorm(dim, dtype=torch.float16),
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize("fraction", [0.75, 0.5, 0.25, 0.0])
def test_streamed_model_equals_resident_model_within_its_budget(
    torch: Any, fraction: float
) -> None:
    from tidal.runtime.backends.streaming import StreamedLayers, layer_nbytes

    count, dim, batch = 12, 2048, 64
    device = torch.device("cuda", 0)
    x = torch.randn(batch, dim, dtype=torch.float16, device=device)
    resident = [layer.to(device) for layer in make_layers(torch, count, dim)]
    with torch.no_grad():
        expected = x
        for layer in resident:
            expected = layer(expected)
    del resident
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    layers = make_layers(torch, count, dim)
    sizes = [layer_nbytes(layer) for layer in layers]
    reserve = 16 * MiB  # activations of batch 64 x 2048 fp16 are 256 KiB each: ample
    budget = int(sum(sizes) * fraction) + 2 * max(sizes) + reserve
    plan = plan_layer_residency(sizes, budget, reserve)
    assert plan.streaming, plan
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    model = StreamedLayers(torch, layers, plan, device)
    with torch.no_grad():
        for _ in range(3):  # passes back to back: the slots are reused across passes
            got = model(x)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(device) - before
    try:
        assert torch.equal(got, expected), (
            f"streamed output differs from the resident model's at {fraction:.0%} resident "
            f"({plan}): max abs diff {(got.float() - expected.float()).abs().max().item()}"
        )
        assert peak <= budget, (
            f"peak device memory {peak}B over the budget {budget}B at {fraction:.0%} resident "
            f"({plan})"
        )
        assert model.streamed_bytes_per_pass == plan.streamed_bytes, plan
    finally:
        model.close()
