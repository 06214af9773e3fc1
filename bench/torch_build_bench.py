"""The torch (AOTInductor) builder on a GPU: packages per precision, gated, then served.

Run on the device machine (bench/gpu_device_run.sh with MODE=torch-build is the whole call):

  python bench/torch_build_bench.py sources DIR   # train the models, export them, write specs
  python -m tidal.runtime.builder DIR/<model>/spec-<precision>.yaml   # one build per precision
  python -m tidal.runtime.builder DIR/<model>/spec.yaml   # every precision: all reused
  python bench/torch_build_bench.py run DIR       # throughput of what was published

Models (both trained on scikit-learn's digits here, so that the gate's labelled accuracy means
something; 1347 training digits, 450 held out as the validation set):
``small`` 64-512-512-10 (0.3 M parameters) and ``wide`` 64-4096-4096-4096-10 (34 M, where the
4096x4096 products dominate).  Each is exported with ``torch.export`` (batch axis dynamic,
1..64) and saved with ``torch.export.save``: the source a user hands the builder.

``run``: for each published package, throughput (rows/s) at batch 1, 8 and 64 of the runtime's
torch backend (``TorchAOTIBackend.load`` then ``engine.infer``, numpy in and out: the call the
batcher makes, CUDA graphs on) against three direct eager calls of the same model in this process
with host arrays in and out (the same work): the trained ``nn.Module`` in FP32 (the plain
direct call), the FP32 source program (``ExportedProgram.module()``, which checks its input
guards and flattens its arguments on every call) and the same precision's eager module (the
builder's own precision transform, not compiled).
Rounds alternate between the three calls; each figure is the median of the rounds.  The gate's
numbers come from each package's manifest.  Figures only; nothing here asserts.

Without a GPU (to try it on a CPU): ``--quick`` narrows the wide model and builds for ``cpu``.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_bench import timed_calls  # noqa: E402  (5 warm-up calls, then >= 20 timed)

PRECISIONS = ("fp32", "fp16", "bf16")  # fp8: not offered (runtime/BUILD.md)
MODELS = {"small": [512, 512], "wide": [4096, 4096, 4096]}
QUICK_MODELS = {"small": [64, 64], "wide": [256, 256]}
MAX_BATCH = 64
BATCHES = (1, 8, 64)
BEGAN = time.perf_counter()


def log(text: str) -> None:
    now = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[{now} +{time.perf_counter() - BEGAN:.1f}s] {text}", flush=True)


def target_of(torch: Any) -> str:
    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def make_mlp(torch: Any, hidden: list[int]) -> Any:
    widths = [64, *hidden, 10]
    layers: list[Any] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def train(torch: Any, hidden: list[int], x: Any, y: Any, device: Any) -> Any:
    """An MLP classifier trained with Adam on the digits (full batch, 300 steps)."""
    torch.manual_seed(0)
    model = make_mlp(torch, hidden).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs, ys = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    for _ in range(300):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        optimizer.step()
    return model.eval().cpu()


def spec_for(folder: Path, model: str, target: str, precisions: list[str]) -> dict[str, Any]:
    return {
        "model": model,
        "version": "1",
        "source": {"uri": str(folder / "source.pt2")},
        "backend": "torch",
        "target": target,
        "precisions": precisions,
        "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [MAX_BATCH, 64]}],
        "validation": {"uri": str(folder / "validation.npz"), "labels": "labels"},
        "gate": {"minTop1Agreement": 0.99, "maxAccuracyDrop": 0.01},
        "output": str(folder.parent / "published"),
    }


def cmd_sources(out: Path, quick: bool) -> None:
    import torch

    from tidal.runtime import modelgen

    data = modelgen.digits_split(seed=0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target = target_of(torch)
    precisions = list(PRECISIONS) if target != "cpu" else ["fp32", "bf16"]
    log(f"sources: torch {torch.__version__}, target {target}, precisions {precisions}")
    for name, hidden in (QUICK_MODELS if quick else MODELS).items():
        started = time.perf_counter()
        model = train(torch, hidden, data.train_x, data.train_y, device)
        with torch.no_grad():
            accuracy = float(
                (model(torch.from_numpy(data.test_x)).argmax(1).numpy() == data.test_y).mean()
            )
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        program = torch.export.export(
            model, (torch.from_numpy(data.train_x[:4]),), dynamic_shapes=({0: batch},)
        )
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.export.save(program, str(folder / "source.pt2"))
        np.savez(folder / "validation.npz", input=data.test_x, labels=data.test_y)
        # The trained nn.Module's weights, for the plain eager baseline of ``run``.
        torch.save(model.state_dict(), folder / "module.pt")
        (folder / "hidden.json").write_text(json.dumps(hidden))
        params = sum(p.numel() for p in model.parameters())
        for precision in precisions:
            spec = spec_for(folder, name, target, [precision])
            (folder / f"spec-{precision}.json").write_text(json.dumps(spec, indent=1))
        (folder / "spec.json").write_text(json.dumps(spec_for(folder, name, target, precisions)))
        log(
            f"sources: {name} 64-{'-'.join(map(str, hidden))}-10, {params / 1e6:.2f} M "
            f"parameters, trained in {time.perf_counter() - started:.1f} s, held-out accuracy "
            f"{accuracy:.4f}; {folder / 'source.pt2'} "
            f"({(folder / 'source.pt2').stat().st_size / 2**20:.1f} MiB)"
        )
    print(f"torchao installed: {importlib.util.find_spec('torchao') is not None}")


def measure_batch(
    torch: Any,
    engine: Any,
    eager: dict[str, Any],
    device: Any,
    x: np.ndarray[Any, Any],
    rounds: int,
    budget_s: float,
) -> dict[str, list[float]]:
    """Median seconds per call of the package and of each eager module (host arrays in and
    out), in ``rounds`` rounds that alternate between them."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def direct(module: Any) -> Any:
        def call() -> None:
            with torch.inference_mode():
                module(torch.from_numpy(x).to(device)).cpu().numpy()

        return call

    calls = {"package": lambda: engine.infer({"input": x})}
    calls.update({name: direct(module) for name, module in eager.items()})
    for call in calls.values():  # warm-up (clocks up, lazy loads) outside the rounds
        timed_calls(call, 0.1, sync)
    medians: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            medians[key].append(statistics.median(timed_calls(call, budget_s, sync)))
    return medians


def cmd_run(out: Path, rounds: int, budget_s: float) -> None:
    import torch

    from tidal.runtime.backends.torch_aoti import TorchAOTIBackend
    from tidal.runtime.builder.aoti import ServedModel, TorchAOTIMaker
    from tidal.runtime.builder.plan import Manifest
    from tidal.runtime.builder.spec import parse_build_spec
    from tidal.runtime.core.engines import describe_engine

    cuda = torch.cuda.is_available()
    backend = TorchAOTIBackend(0 if cuda else "cpu")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"device {device_name}; torch {torch.__version__}; {rounds} alternating rounds")
    print(f"torchao installed: {importlib.util.find_spec('torchao') is not None}")
    gate_rows = []
    speed_rows = []
    for name in MODELS:
        folder = out / name
        if not (folder / "spec.json").is_file():
            continue
        spec = parse_build_spec(json.loads((folder / "spec.json").read_text()))
        maker = TorchAOTIMaker(spec)
        program = maker.open_source(folder / "source.pt2")
        eager32 = program.module()
        module32 = make_mlp(torch, json.loads((folder / "hidden.json").read_text()))
        module32.load_state_dict(torch.load(folder / "module.pt", weights_only=True))
        module32 = module32.eval().to(maker.device)
        validation = np.load(folder / "validation.npz")["input"]
        for precision in spec.precisions:
            manifest_path = out / "published" / name / "1" / spec.target / precision
            manifest_file = manifest_path / "manifest.json"
            if not manifest_file.is_file():
                gate_rows.append(f"{name:6s} {precision:5s} | not built (no manifest)")
                continue
            m = Manifest.model_validate_json(manifest_file.read_text())
            acc = m.accuracy
            gate_rows.append(
                f"{name:6s} {precision:5s} | {'published' if m.published else 'REFUSED':9s} | "
                f"{acc.top1_agreement:.4f} | {acc.reference_accuracy:.4f} -> "
                f"{acc.candidate_accuracy:.4f} ({-(acc.accuracy_drop or 0):+.4f}) | "
                f"{acc.max_abs_error:.3g} | {acc.mean_abs_error:.3g} | "
                f"{m.build_seconds:6.1f} | {m.file.size_bytes / 2**20:7.2f}"
            )
            if not m.published:
                continue
            path = manifest_path / m.file.name
            engine = backend.load(
                path, describe_engine(str(path)), ServedModel(name, MAX_BATCH, (precision,)), 0
            )
            eager_same = maker.precision_module(precision)
            graphs = len(getattr(engine, "graph_batch_sizes", []))
            for batch in BATCHES:
                x = np.ascontiguousarray(np.resize(validation, (batch, validation.shape[1])))
                x = x.astype(np.float32)

                medians = measure_batch(
                    torch,
                    engine,
                    {"module32": module32, "eager32": eager32, "eager_same": eager_same},
                    maker.device,
                    x,
                    rounds,
                    budget_s,
                )
                rate = {k: batch / statistics.median(v) for k, v in medians.items()}
                spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in medians.items()}
                speed_rows.append(
                    f"{name:6s} {precision:5s} {batch:5d} | {rate['package']:9.0f} | "
                    f"{rate['module32']:9.0f} | {rate['eager32']:9.0f} | "
                    f"{rate['eager_same']:10.0f} | {rate['package'] / rate['module32']:6.2f}x | "
                    f"{rate['package'] / rate['eager32']:6.2f}x | "
                    f"{rate['package'] / rate['eager_same']:6.2f}x | "
                    f"{statistics.median(medians['package']) * 1e3:7.3f} | "
                    f"{max(spread.values()):5.1%} | {graphs}"
                )
                log(speed_rows[-1])
            engine.close()
        maker.close()
    print()
    print("gate (validation: 450 held-out digits, labels; reference: the FP32 source, eager)")
    print(
        "model  prec  | verdict   | top-1 agr | accuracy fp32 -> package (delta) | max abs | "
        "mean abs | build s | MiB"
    )
    print("\n".join(gate_rows))
    print()
    print(
        "throughput, rows/s (median of rounds); package = runtime torch backend engine.infer "
        "(numpy in/out, CUDA graphs); module32 = the trained nn.Module, FP32, eager; eager32 = "
        "the FP32 source program (ExportedProgram.module()), eager; eager_same = the builder's "
        "module of the same precision, eager; every eager call host tensors in and out"
    )
    print(
        "model  prec  batch |   package |  module32 |   eager32 | eager_same | vs mod32 | "
        "vs ep32 | vs same | P50 ms  | spread | graphs"
    )
    print("\n".join(speed_rows))
    backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sources = sub.add_parser("sources")
    sources.add_argument("dir", type=Path)
    sources.add_argument("--quick", action="store_true")
    run = sub.add_parser("run")
    run.add_argument("dir", type=Path)
    run.add_argument("--rounds", type=int, default=5)
    run.add_argument("--seconds", type=float, default=0.2, help="per call and round")
    args = parser.parse_args()
    if args.cmd == "sources":
        cmd_sources(args.dir, args.quick)
    else:
        cmd_run(args.dir, args.rounds, args.seconds)


if __name__ == "__main__":
    main()
