"""INT8 against FP32 on CPU through the runtime's ONNX Runtime backend, at batch 1, 8 and 64.

What it measures, in one run: two MLPs trained on scikit-learn's digits at start (a small one,
64-64-10, and a wide one, 64-512-512-10), each built by the engine builder
(``tidal.runtime.builder``: the graph-optimized FP32 engine and the static INT8 engine calibrated
on the training digits, both through the accuracy gate). Each engine is then opened by the
runtime's own backend (``OnnxRuntimeBackend.load``: the runtime's session options, one intra-op
thread here so that 2 shared cores give stable numbers) and run through ``OnnxEngine.infer``,
the call the batcher makes for a batch. Not measured: HTTP, queueing, dynamic batching (the
same for both precisions; bench/runtime_bench.py measures them).

* throughput: rows per second per batch size, FP32 and INT8 timed in alternating rounds (the
  median round counts), and the INT8/FP32 ratio; beside them ``int8-trt``, the Q/DQ model the
  TensorRT builder hands TensorRT (symmetric INT8, FP32 bias: ``tensorrt.TENSORRT_QDQ_OPTIONS``)
  run by ONNX Runtime, where the TensorRT build gates it;
* accuracy: labelled accuracy of both on the held-out digits and the delta, top-1 agreement
  with FP32, through the same ``infer`` call.

    .venv/bin/python bench/int8_bench.py [--seconds 0.4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from tidal.runtime import modelgen
from tidal.runtime.backends.onnx import OnnxEngine, OnnxRuntimeBackend
from tidal.runtime.builder.build import build
from tidal.runtime.builder.onnxrt import inputs_of, quantize_int8, session
from tidal.runtime.builder.spec import QuantizationSpec, parse_build_spec
from tidal.runtime.builder.tensorrt import TENSORRT_QDQ_OPTIONS
from tidal.runtime.config import ModelSpec, OnnxRuntimeSpec
from tidal.runtime.core.engines import describe_engine

BATCHES = (1, 8, 64)
MODELS = {"digits-small": (64,), "digits-wide": (512, 512)}


def load(path: Path) -> OnnxEngine:
    backend = OnnxRuntimeBackend(OnnxRuntimeSpec(intra_op_threads=1))
    uri = path.as_uri()
    model = ModelSpec(name="digits", engines=[{"uri": uri}], max_batch_size=64)  # type: ignore[list-item]
    return backend.load(path, describe_engine(uri), model, 1 << 30)


def rows_per_second(engine: OnnxEngine, batch: np.ndarray[Any, Any], seconds: float) -> float:
    feed = {"input": batch}
    engine.infer(feed)
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        engine.infer(feed)
        runs += 1
    return runs * batch.shape[0] / elapsed


def predictions(engine: OnnxEngine, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    parts = [engine.infer({"input": x[i : i + 64]})["logits"] for i in range(0, len(x), 64)]
    return np.concatenate(parts).argmax(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=0.4, help="per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidal-int8-bench-"))
    data = modelgen.digits_split(seed=0)
    np.savez(work / "calibration.npz", input=data.train_x)
    np.savez(work / "validation.npz", input=data.test_x, labels=data.test_y)
    print(
        f"onnxruntime {ort.__version__}, CPU, intra-op threads 1, {args.rounds} rounds x "
        f"{args.seconds}s per point (median round)"
    )
    for name, hidden in MODELS.items():
        modelgen.write_digits_mlp(work / f"{name}.onnx", data, hidden=hidden, seed=0)
        spec = parse_build_spec(
            {
                "model": name,
                "version": "bench",
                "source": {"uri": str(work / f"{name}.onnx")},
                "precisions": ["fp32", "int8"],
                "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
                "calibration": {"uri": str(work / "calibration.npz")},
                "validation": {"uri": str(work / "validation.npz"), "labels": "labels"},
                "output": str(work / "store"),
            }
        )
        report = build(spec, work / "build")
        report.raise_for_refusal()
        paths = {
            a.precision: Path(a.engine_uri.removeprefix("file://"))
            for a in report.artifacts
            if a.engine_uri
        }
        source = work / f"{name}.onnx"
        paths["int8-trt"] = work / f"{name}-int8-trt.qdq.onnx"
        quantize_int8(
            source,
            paths["int8-trt"],
            {"input": data.train_x},
            inputs_of(session(source)),
            QuantizationSpec(),
            64,
            None,
            TENSORRT_QDQ_OPTIONS,
        )
        engines = {p: load(path) for p, path in paths.items()}
        sizes = {p: path.stat().st_size for p, path in paths.items()}
        print(
            f"\n{name} (64-{'-'.join(map(str, hidden))}-10): fp32 {sizes['fp32']} B, "
            f"int8 {sizes['int8']} B ({sizes['int8'] / sizes['fp32']:.2f}x)"
        )
        top = {p: predictions(e, data.test_x) for p, e in engines.items()}
        accuracy = {p: float((t == data.test_y).mean()) for p, t in top.items()}
        for kind in ("int8", "int8-trt"):
            agreement = float((top[kind] == top["fp32"]).mean())
            print(
                f"  accuracy on {len(data.test_y)} held-out digits: fp32 {accuracy['fp32']:.4f}, "
                f"{kind} {accuracy[kind]:.4f}, delta {accuracy[kind] - accuracy['fp32']:+.4f}; "
                f"top-1 agreement {agreement:.4f}"
            )
        print(
            f"  {'batch':>5}  {'fp32 rows/s':>12}  {'int8 rows/s':>12}  {'int8/fp32':>9}"
            f"  {'int8-trt rows/s':>15}  {'int8-trt/fp32':>13}"
        )
        kinds = ("fp32", "int8", "int8-trt")
        for size in BATCHES:
            batch = np.ascontiguousarray(data.test_x[:size])
            rounds: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.rounds):
                for kind in kinds:
                    rounds[kind].append(rows_per_second(engines[kind], batch, args.seconds))
            fp32, int8, trt = (statistics.median(rounds[k]) for k in kinds)
            print(
                f"  {size:>5}  {fp32:>12.0f}  {int8:>12.0f}  {int8 / fp32:>8.2f}x"
                f"  {trt:>15.0f}  {trt / fp32:>12.2f}x"
            )


if __name__ == "__main__":
    main()
