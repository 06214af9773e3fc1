"""Issue 46's pure parts, no GPU: chunk planning, the chunk digest record, the layer split."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.runtime.backends.staging import (
    ChunkDigests,
    chunk_sha256_file,
    copy_offsets,
    plan_chunks,
)
from tidal.runtime.core.weightstreaming import DoesNotFitError, plan_layer_residency


@given(
    file_bytes=st.integers(1, 10_000),
    data=st.data(),
    chunk=st.integers(1, 3000),
)
def test_chunks_tile_the_region_and_stay_on_the_files_grid(
    file_bytes: int, data: st.DataObject, chunk: int
) -> None:
    offset = data.draw(st.integers(0, file_bytes))
    length = data.draw(st.integers(0, file_bytes - offset))
    chunks = plan_chunks(file_bytes, offset, length, chunk)
    assert all(c.file_offset == c.index * chunk for c in chunks), chunks
    ranges = copy_offsets(chunks)
    assert sum(b - a for a, b in ranges) == length, (ranges, offset, length)
    assert all(a2 == b1 for (_, b1), (a2, _) in itertools.pairwise(ranges)), ranges
    for c in chunks:
        assert c.file_offset + c.copy_from == offset + c.copy_to, c
        assert c.copy_from + c.copy_bytes <= c.nbytes, c


def test_whole_file_plan_reads_every_chunk_and_copies_only_the_region() -> None:
    chunks = plan_chunks(1000, 250, 100, chunk_bytes=200, whole_file=True)
    assert [c.index for c in chunks] == [0, 1, 2, 3, 4]
    assert [(c.copy_from, c.copy_bytes, c.copy_to) for c in chunks if c.copy_bytes] == [
        (50, 100, 0)
    ]
    assert [c.nbytes for c in chunks] == [200] * 5


def test_a_region_outside_the_file_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        plan_chunks(100, 50, 51)


def test_chunk_digests_match_hashlib_and_round_trip(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41  # 10496 bytes: the last chunk is short
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    digests = chunk_sha256_file(path, chunk_bytes=4096, threads=3)
    assert digests.sha256 == tuple(
        hashlib.sha256(data[i : i + 4096]).hexdigest() for i in range(0, len(data), 4096)
    )
    assert ChunkDigests.from_json(digests.to_json()) == digests
    assert digests.mismatch(2, data[8192:]) is None
    why = digests.mismatch(1, b"x" * 4096)
    assert why is not None and "chunk 1 " in why, why


def test_chunk_digests_must_cover_the_file() -> None:
    with pytest.raises(ValueError, match="expected 3"):
        ChunkDigests(chunk_bytes=10, file_bytes=25, sha256=("a", "b"))


@pytest.mark.parametrize(
    "budget,resident,reason",
    [
        (1100, 10, "resident:all-layers"),  # 10 x 100 + reserve 100
        (1099, 7, "stream:3-of-10-layers"),  # 700 kept + 2 x 100 slots + 100 = 1000
        (800, 5, "stream:5-of-10-layers"),
        (300, 0, "stream:10-of-10-layers"),
    ],
)
def test_layer_residency_keeps_the_longest_prefix_that_fits(
    budget: int, resident: int, reason: str
) -> None:
    plan = plan_layer_residency([100] * 10, budget, reserve_bytes=100)
    assert (plan.resident, plan.reason) == (resident, reason), plan
    assert plan.device_bytes <= budget, plan
    assert plan.streamed_bytes == 100 * (10 - resident), plan


def test_layer_residency_refuses_a_budget_below_two_slots() -> None:
    with pytest.raises(DoesNotFitError, match="two slots"):
        plan_layer_residency([100, 300], 400, reserve_bytes=50)
