"""FP16, BF16, FP8 and INT8 of the worked example (64-512-512-10 on the digits) on a GPU, at batch
64, in torch: is a quantized matrix product faster than FP16 where the model is this small?

Two steps, because the device machine has torch but not scikit-learn:

    .venv/bin/python bench/fp8_gpu_bench.py prepare DIR   # here: train, save weights + split
    python3 bench/fp8_gpu_bench.py run DIR                # on the GPU machine

``run`` builds the MLP in torch from the trained weights and times each precision's forward
pass at batch 64 (and at 4096, and on a 4096-wide random MLP, to show where the quantized
products start to pay), each replayed from a CUDA graph (no launch overhead: the kernels' own
time), FP16 measured in the same run as the baseline. FP8: ``torch._scaled_mm`` with e4m3
weights (per-tensor scale) and per-call per-tensor activation scales, the 512->10 layer in
BF16 (its 10 outputs are not a multiple of 16), as the torch builder's fp8 scheme
(runtime/builder/plan.py TORCH_SCHEMES). INT8: ``torch._int_mm`` with symmetric per-tensor
activation scales and per-channel weight scales, the last layer in FP16. Accuracy on the 450
held-out digits against the labels and FP32.

Not through the runtime's torch backend (AOTInductor packages): the kernels are what differ
between precisions, and this measures them alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN = (512, 512)


def prepare(out: Path) -> None:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from tidal.runtime.modelgen import digits_split

    data = digits_split(seed=0)
    # the same classifier as tidal.runtime.modelgen.write_digits_mlp (bench/int8_bench.py)
    classifier = MLPClassifier(hidden_layer_sizes=HIDDEN, max_iter=200, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        classifier.fit(data.train_x, data.train_y)
    arrays: dict[str, Any] = {"test_x": data.test_x, "test_y": data.test_y}
    for i, (w, b) in enumerate(zip(classifier.coefs_, classifier.intercepts_, strict=True)):
        arrays[f"w{i}"] = w.astype(np.float32)  # (in, out)
        arrays[f"b{i}"] = b.astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "digits-wide.npz", **arrays)
    print(f"wrote {out / 'digits-wide.npz'}: layers {[a.shape for a in classifier.coefs_]}")


def run(folder: Path) -> None:
    import torch

    dev = torch.device("cuda")
    data = np.load(folder / "digits-wide.npz")
    layers = [
        (torch.tensor(data[f"w{i}"], device=dev), torch.tensor(data[f"b{i}"], device=dev))
        for i in range(len(HIDDEN) + 1)
    ]
    test_x = torch.tensor(data["test_x"], device=dev)
    test_y = data["test_y"]
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
        f"capability {torch.cuda.get_device_capability()}"
    )
    fp8 = torch.float8_e4m3fn
    fp8_max = torch.finfo(fp8).max

    def make(precision: str, weights: list[tuple[Any, Any]]) -> Any:
        """A forward function of one precision (FP32 in, FP32 logits out)."""
        last = len(weights) - 1
        if precision in ("fp32", "fp16", "bf16"):
            dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
                precision
            ]
            cast = [(w.to(dtype), b.to(dtype)) for w, b in weights]

            def forward(x: Any) -> Any:
                h = x.to(dtype)
                for i, (w, b) in enumerate(cast):
                    h = torch.addmm(b, h, w)
                    if i < last:
                        h = torch.relu(h)
                return h.float()

            return forward
        if precision == "fp8":
            packed = []
            for w, b in weights[:-1]:
                scale = (w.abs().max() / fp8_max).float()
                w8 = (w / scale).to(fp8).t().contiguous().t()  # (in, out), column-major
                packed.append((w8, scale, b.to(torch.bfloat16)))
            w_last, b_last = (t.to(torch.bfloat16) for t in weights[-1])

            def forward(x: Any) -> Any:
                h = x
                for w8, w_scale, b in packed:
                    a_scale = (h.abs().amax().float() / fp8_max).clamp(min=1e-12)
                    a8 = (h / a_scale).to(fp8)
                    h = torch._scaled_mm(
                        a8, w8, scale_a=a_scale, scale_b=w_scale, out_dtype=torch.bfloat16
                    )
                    h = torch.relu(h + b)
                return torch.addmm(b_last, h, w_last).float()

            return forward
        if precision == "int8":
            packed = []
            for w, b in weights[:-1]:
                scale = (w.abs().amax(dim=0) / 127.0).clamp(min=1e-12)  # per output channel
                # column-major, as cuBLASLt's int8 product wants its second operand (row-major
                # failed on an H100: CUBLAS_STATUS_NOT_SUPPORTED, transpose_mat2 0)
                w8 = torch.round(w / scale).clamp(-127, 127).to(torch.int8).t().contiguous().t()
                packed.append((w8, scale, b))
            w_last, b_last = (t.to(torch.float16) for t in weights[-1])

            def forward(x: Any) -> Any:
                h = x
                for w8, w_scale, b in packed:
                    a_scale = (h.abs().amax() / 127.0).clamp(min=1e-12)
                    a8 = torch.round(h / a_scale).clamp(-127, 127).to(torch.int8)
                    h = torch._int_mm(a8, w8).float() * (a_scale * w_scale)
                    h = torch.relu(h + b)
                return torch.addmm(b_last, h.half(), w_last).float()

            return forward
        raise ValueError(precision)

    def rows_per_second(forward: Any, batch: int, width_in: int, seconds: float = 1.0) -> float:
        x = torch.randn(batch, width_in, device=dev).abs()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                forward(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward(x)
        replays = 20
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
        while True:
            start = time.perf_counter()
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return replays * batch / elapsed
            replays *= 2

    precisions = ("fp32", "fp16", "bf16", "fp8", "int8")
    forwards = {p: make(p, layers) for p in precisions}
    with torch.no_grad():
        logits = {p: f(test_x) for p, f in forwards.items()}
        top = {p: v.argmax(1).cpu().numpy() for p, v in logits.items()}
    print(f"\ndigits 64-512-512-10, accuracy on {len(test_y)} held-out digits:")
    for p in precisions:
        accuracy = float((top[p] == test_y).mean())
        agree = float((top[p] == top["fp32"]).mean())
        print(f"  {p:>5}: accuracy {accuracy:.4f}, top-1 agreement with fp32 {agree:.4f}")

    rng = torch.Generator(device=dev).manual_seed(0)
    wide = [
        (
            torch.randn(a, b, device=dev, generator=rng) / a**0.5,
            torch.zeros(b, device=dev),
        )
        for a, b in ((4096, 4096), (4096, 4096), (4096, 16))
    ]
    shapes = (
        ("digits 64-512-512-10", layers, 64, 64),
        ("digits 64-512-512-10", layers, 4096, 64),
        ("random 4096-4096-4096-16", wide, 64, 4096),
        ("random 4096-4096-4096-16", wide, 4096, 4096),
    )
    print("\nthroughput (rows/s, CUDA graph replay), ratio against fp16 in the same run:")
    print(f"  {'model':<26} {'batch':>5}  " + "  ".join(f"{p:>14}" for p in precisions))
    with torch.no_grad():
        for name, weights, batch, width_in in shapes:
            made = forwards if weights is layers else {p: make(p, weights) for p in precisions}
            rates = {p: rows_per_second(made[p], batch, width_in) for p in precisions}
            cells = "  ".join(
                f"{rates[p]:>9.3g} {rates[p] / rates['fp16']:>4.2f}x" for p in precisions
            )
            print(f"  {name:<26} {batch:>5}  {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    prepare(args.folder) if args.step == "prepare" else run(args.folder)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
