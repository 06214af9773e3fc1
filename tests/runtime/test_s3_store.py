"""s3:// engines: the runtime's storage against a real S3-compatible server (versitygw, built by
`make sandbox-binaries`), and the ordered ranged reads on their own."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton

from tidal.runtime.config import S3Spec
from tidal.runtime.errors import EngineLoadError
from tidal.runtime.storage import (
    BackgroundDigest,
    EngineStore,
    in_order,
    part_ranges,
    split_s3_uri,
)
from tidal.sandbox.objectstore import ObjectStore

MIB = 2**20


# -- pure parts ---------------------------------------------------------------------------------


def test_split_s3_uri_names_bucket_and_key() -> None:
    assert split_s3_uri("s3://engines/mlp/v1/model.onnx") == ("engines", "mlp/v1/model.onnx")
    for bad in ("s3://engines", "s3://engines/", "s3:///key", "s3://b/dir/"):
        with pytest.raises(EngineLoadError, match="expected s3://bucket/key"):
            split_s3_uri(bad)


def test_part_ranges_cover_the_object_once() -> None:
    assert part_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert part_ranges(8, 4) == [(0, 4), (4, 8)]
    assert part_ranges(0, 4) == []


def test_the_background_digest_is_the_sha256_of_the_chunks_in_order() -> None:
    chunks = [os.urandom(n) for n in (1, 4096, 2**20, 3)]
    with BackgroundDigest(lag=2) as digest:
        for chunk in chunks:
            digest.update(memoryview(chunk))
        assert digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()


def test_the_background_digest_thread_ends_with_its_block_on_failure() -> None:
    with pytest.raises(OSError), BackgroundDigest() as digest:
        digest.update(b"x")
        raise OSError("disk full")
    assert not digest._thread.is_alive()


def test_in_order_yields_parts_in_order_within_the_window() -> None:
    """Parts come back in order whatever order they finish in, with at most `workers`
    requests at once and never more than twice that fetched ahead."""
    ranges = part_ranges(64, 4)
    lock = threading.Lock()
    running = 0
    peak = 0
    started: list[int] = []

    def fetch(start: int, end: int) -> bytes:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            started.append(start)
        time.sleep(0.002 * (7 - start // 4 % 7))  # later parts often finish first
        with lock:
            running -= 1
        return bytes([start // 4]) * (end - start)

    out = []
    for consumed, chunk in enumerate(in_order(fetch, ranges, workers=3)):
        # never more than 2 x workers parts requested beyond what was consumed
        assert len(started) <= consumed + 2 * 3, (len(started), consumed)
        out.append(chunk)
    assert b"".join(out) == b"".join(bytes([i]) * 4 for i in range(16))
    assert peak <= 3


def test_in_order_raises_the_first_failure() -> None:
    def fetch(start: int, end: int) -> bytes:
        if start == 8:
            raise OSError("connection reset")
        return b"x" * (end - start)

    with pytest.raises(OSError, match="connection reset"):
        list(in_order(fetch, part_ranges(32, 4), workers=2))


# -- against versitygw ----------------------------------------------------------------------------


def _spec(s3: ObjectStore, **extra: Any) -> S3Spec:
    return S3Spec(endpoint=s3.endpoint, **extra)


@pytest.mark.sandbox
def test_small_and_ranged_objects_arrive_verified(s3, aws_env, tmp_path: Path) -> None:
    small = b"engine-bytes" * 1000
    large = np.random.default_rng(1).bytes(5 * MIB + 12345)
    s3.put("engines", "m/small.bin", small)
    s3.put("engines", "m/large.bin", large)
    store = EngineStore(str(tmp_path / "cache"), _spec(s3, part_bytes=MIB, concurrency=3))
    sha_small = hashlib.sha256(small).hexdigest()
    sha_large = hashlib.sha256(large).hexdigest()
    assert store.fetch("s3://engines/m/small.bin", sha_small).read_bytes() == small
    path = store.fetch("s3://engines/m/large.bin", sha_large)
    assert path.read_bytes() == large
    # a verified copy is reused (the cache is the node's)
    assert store.fetch("s3://engines/m/large.bin", sha_large) == path


@pytest.mark.sandbox
def test_a_corrupt_object_is_refused_and_not_kept(s3, aws_env, tmp_path: Path) -> None:
    s3.put("engines", "m/corrupt.bin", b"not what was published")
    store = EngineStore(str(tmp_path / "cache"), _spec(s3))
    with pytest.raises(EngineLoadError, match="corrupt or not the configured one"):
        store.fetch("s3://engines/m/corrupt.bin", "0" * 64)
    assert not any((tmp_path / "cache").iterdir())


@pytest.mark.sandbox
@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("s3://engines/m/missing.bin", "no such bucket or key"),
        ("s3://no-such-bucket/m/x.bin", "no such bucket or key"),
    ],
)
def test_missing_bucket_or_key_names_the_object(s3, aws_env, tmp_path, uri, reason) -> None:
    store = EngineStore(str(tmp_path / "cache"), _spec(s3, max_retries=0))
    with pytest.raises(EngineLoadError) as error:
        store.fetch(uri, None)
    assert uri in str(error.value) and reason in str(error.value), error.value
    assert s3.endpoint in str(error.value)


@pytest.mark.sandbox
def test_wrong_credentials_are_the_store_answer(s3, tmp_path, monkeypatch) -> None:
    s3.put("engines", "m/private.bin", b"x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong" + s3.secret_key[5:])
    store = EngineStore(str(tmp_path / "cache"), _spec(s3, max_retries=0))
    with pytest.raises(EngineLoadError) as error:
        store.fetch("s3://engines/m/private.bin", None)
    message = str(error.value)
    assert "credentials" in message and "403" in message, message
    assert "Debug source" not in message and s3.secret_key[5:] not in message, message


@pytest.mark.sandbox
def test_runtime_serves_a_model_from_s3(s3, aws_env, serve, models, model_entry, tmp_path):
    """The whole path: the runtime's configuration names the store, the engine arrives in the
    node cache, the model answers, and the load's fetch phase is measured."""
    info = models["mlp"]
    s3.put_file("engines", "mlp/v1/model.onnx", info.path)
    entry = model_entry(info, "remote")
    entry["engines"][0]["uri"] = "s3://engines/mlp/v1/model.onnx"
    rt = serve(
        {"models": [entry], "cacheDir": str(tmp_path / "cache"), "s3": {"endpoint": s3.endpoint}}
    )
    client = triton.InferenceServerClient(rt.url)
    x = np.ones((2, 16), np.float32)
    request = triton.InferInput("input", list(x.shape), "FP32")
    request.set_data_from_numpy(x)
    result = client.infer("remote", [request])
    assert result.as_numpy("output").shape == (2, 4)
    client.close()
    assert rt.metric("tidal_engine_cache_bytes", tier="host") == info.size_bytes
    fetches = rt.metric("tidal_engine_load_seconds_count", model="remote", phase="fetch")
    assert fetches == 1, rt.metrics_text()
