"""The torch backend's loader thread (DedicatedThread): no torch, no GPU needed, runs in CI.

Package loads go through one such thread per backend, one at a time, with the backend's CUDA
device current on it; what it must guarantee is checked here, loads through it on a GPU in
tests/gpu/test_torch_aoti_gpu.py (8 passed on an H200,
bench/results/gpu_bench-h200-2026-12-04b.txt).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.thread import BrokenThreadPool

import pytest

from tidal.runtime.backends.torch_aoti import LOADER_STACK_BYTES, DedicatedThread


def test_calls_run_in_order_on_one_thread_after_its_initializer() -> None:
    seen: list[tuple[str, int]] = []
    loader = DedicatedThread(
        "t-loader", LOADER_STACK_BYTES, lambda: seen.append(("init", threading.get_ident()))
    )
    try:
        with ThreadPoolExecutor(4) as callers:
            results = list(
                callers.map(lambda i: loader.call(lambda: (i, threading.get_ident())), range(8))
            )
        assert [i for i, _ in results] == list(range(8))
        assert {ident for _, ident in results} == {loader.ident}
        assert seen == [("init", loader.ident)]
        assert loader.ident != threading.get_ident()
    finally:
        loader.close()


def test_the_stack_size_is_set_only_while_the_thread_is_made() -> None:
    before = threading.stack_size()
    loader = DedicatedThread("t-loader", LOADER_STACK_BYTES)
    try:
        assert threading.stack_size() == before
    finally:
        loader.close()


def test_a_call_from_the_thread_itself_runs_inline_and_errors_come_back() -> None:
    loader = DedicatedThread("t-loader", LOADER_STACK_BYTES)
    try:
        assert loader.call(lambda: loader.call(threading.get_ident)) == loader.ident

        def fail() -> None:
            raise ValueError("from the loader thread")

        with pytest.raises(ValueError, match="from the loader thread"):
            loader.call(fail)
        assert loader.call(lambda: 7) == 7  # still serving after an error
    finally:
        loader.close()


def test_an_initializer_that_fails_is_reported() -> None:
    def broken() -> None:
        raise RuntimeError("no device")

    with pytest.raises(BrokenThreadPool):
        DedicatedThread("t-loader", LOADER_STACK_BYTES, broken)
