"""Deterministic ONNX test models made with onnx.helper (MLPs and small convnets).

Used by the tests, the end-to-end scenarios, the benchmarks and the demo: nothing is
downloaded.  Weights come from a seeded generator, the batch dimension is dynamic
(``"batch"``), and ``hidden``/``channels`` set the file size so a test can make models of a
known byte size for the cache budget (:func:`mlp_hidden_for_bytes`).

CLI::

    python -m tidal.runtime.modelgen mlp OUT.onnx [--inputs N] [--hidden N] [--outputs N]
        [--layers N] [--seed N]
    python -m tidal.runtime.modelgen convnet OUT.onnx [--channels N] [--size N] [--classes N]

prints ``<sha256>  <bytes>  <path>``. The examples' models, every one they fetch::

    python -m tidal.runtime.modelgen examples OUT_DIR [--examples DIR]
    python -m tidal.runtime.modelgen upload --bucket B [--endpoint URL] [--prefix P]
        [--region R] [--examples DIR]

``examples`` writes them under ``OUT_DIR`` (for an HTTP store or a volume); ``upload`` makes
them and puts them into an S3-compatible bucket with the runtime's S3 client, credentials from
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; each prints ``<sha256>  <bytes>  <key>``.
Without ``--examples`` they are the models of the examples this version ships
(:data:`EXAMPLE_MODELS`, which a test keeps equal to what ``examples/`` fetches): what the
chart's upload Job runs in the runtime image, which holds no checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    sha256: str
    size_bytes: int
    input_name: str
    input_shape: tuple[int, ...]  # -1 for the batch dimension
    output_name: str
    output_shape: tuple[int, ...]
    datatype: str = "FP32"

    @property
    def uri(self) -> str:
        return self.path.resolve().as_uri()


def _save(model: onnx.ModelProto, path: str | Path) -> tuple[Path, str, int]:
    onnx.checker.check_model(model)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = model.SerializeToString()
    out.write_bytes(data)
    return out, hashlib.sha256(data).hexdigest(), len(data)


def _weights(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    fan_in = shape[0] if len(shape) == 2 else int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / math.sqrt(max(1, fan_in))).astype(np.float32)


def write_mlp(
    path: str | Path,
    inputs: int = 16,
    hidden: int = 64,
    outputs: int = 4,
    layers: int = 2,
    seed: int = 0,
    input_name: str = "input",
    output_name: str = "output",
) -> ModelInfo:
    """An MLP: ``layers`` hidden layers of width ``hidden`` with ReLU, then a linear output."""
    rng = np.random.default_rng(seed)
    weights, biases = [], []
    width = inputs
    for index in range(layers + 1):
        out_width = outputs if index == layers else hidden
        weights.append(_weights(rng, (width, out_width)))
        biases.append((0.01 * rng.standard_normal(out_width)).astype(np.float32))
        width = out_width
    return write_layers(
        path, weights, biases, input_name, output_name, f"mlp_{inputs}x{hidden}x{outputs}_s{seed}"
    )


def write_layers(
    path: str | Path,
    weights: list[np.ndarray],
    biases: list[np.ndarray],
    input_name: str = "input",
    output_name: str = "logits",
    graph_name: str = "trained_mlp",
) -> ModelInfo:
    """An MLP from given weights (``weights[i]`` is in x out): Gemm + ReLU per hidden layer,
    a linear output (logits). How a trained network (scikit-learn's ``coefs_`` and
    ``intercepts_``) becomes ONNX without a converter package."""
    nodes = []
    initializers = []
    previous = input_name
    for index, (w, b) in enumerate(zip(weights, biases, strict=True)):
        last = index == len(weights) - 1
        initializers += [
            numpy_helper.from_array(np.asarray(w, dtype=np.float32), f"w{index}"),
            numpy_helper.from_array(np.asarray(b, dtype=np.float32), f"b{index}"),
        ]
        target = output_name if last else f"h{index}"
        pre = target if last else f"z{index}"
        nodes.append(helper.make_node("Gemm", [previous, f"w{index}", f"b{index}"], [pre]))
        if not last:
            nodes.append(helper.make_node("Relu", [pre], [target]))
        previous = target
    inputs, outputs = int(weights[0].shape[0]), int(weights[-1].shape[1])
    graph = helper.make_graph(
        nodes,
        graph_name,
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", inputs])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", outputs])],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tidal.modelgen"
    )
    model.ir_version = 8
    out, digest, size = _save(model, path)
    return ModelInfo(out, digest, size, input_name, (-1, inputs), output_name, (-1, outputs))


@dataclass(frozen=True)
class DigitsSplit:
    """scikit-learn's digits (8x8 images, 10 classes), pixels scaled to [0, 1], split in two."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray


def digits_split(seed: int = 0, test_share: float = 0.25) -> DigitsSplit:
    from sklearn.datasets import load_digits  # the dev extra; the data ship with the package

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - test_share))
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    return DigitsSplit(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


def write_digits_mlp(
    path: str | Path, data: DigitsSplit, hidden: tuple[int, ...] = (64,), seed: int = 0
) -> ModelInfo:
    """Train an MLP classifier on the digits' training split (about a second for one hidden
    layer of 64) and write it as ONNX: input ``input`` (batch x 64), output ``logits``."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    classifier = MLPClassifier(hidden_layer_sizes=hidden, max_iter=200, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # accuracy is measured, not assumed
        classifier.fit(data.train_x, data.train_y)
    return write_layers(path, list(classifier.coefs_), list(classifier.intercepts_))


def write_text_identity(path: str | Path, width: int = 2) -> ModelInfo:
    """A string model (BYTES in, BYTES out): ``output`` is ``input`` (ONNX Identity), batch x
    ``width``. What a tokenizer-in-the-graph model looks like at the API, without the weights."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])],
        "tidal_text",
        [helper.make_tensor_value_info("input", TensorProto.STRING, ["batch", width])],
        [helper.make_tensor_value_info("output", TensorProto.STRING, ["batch", width])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tidal.modelgen"
    )
    model.ir_version = 8
    out, digest, size = _save(model, path)
    return ModelInfo(out, digest, size, "input", (-1, width), "output", (-1, width), "BYTES")


def mlp_hidden_for_bytes(
    target_bytes: int, inputs: int = 16, outputs: int = 4, layers: int = 2
) -> int:
    """The ``hidden`` width whose MLP file is about ``target_bytes`` (float32 weights)."""
    # bytes ~= 4 * (inputs*h + (layers-1)*h*h + h*outputs + layers*h + outputs)
    a = 4.0 * (layers - 1)
    b = 4.0 * (inputs + outputs + layers)
    c = -float(target_bytes)
    if a == 0:
        return max(1, int(-c / b))
    return max(1, int((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))


def write_convnet(
    path: str | Path,
    channels: int = 8,
    size: int = 16,
    classes: int = 10,
    in_channels: int = 3,
    seed: int = 0,
    input_name: str = "image",
    output_name: str = "logits",
) -> ModelInfo:
    """Conv(3x3)-ReLU-Conv(3x3)-ReLU-GlobalAveragePool-Flatten-Gemm on NCHW images."""
    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array(_weights(rng, (channels, in_channels, 3, 3)), "c1_w"),
        numpy_helper.from_array(np.zeros(channels, np.float32), "c1_b"),
        numpy_helper.from_array(_weights(rng, (channels, channels, 3, 3)), "c2_w"),
        numpy_helper.from_array(np.zeros(channels, np.float32), "c2_b"),
        numpy_helper.from_array(_weights(rng, (channels, classes)), "fc_w"),
        numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", [input_name, "c1_w", "c1_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2_w", "c2_b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], [output_name]),
    ]
    graph = helper.make_graph(
        nodes,
        f"convnet_c{channels}_s{size}_k{classes}_seed{seed}",
        [
            helper.make_tensor_value_info(
                input_name, TensorProto.FLOAT, ["batch", in_channels, size, size]
            )
        ],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch", classes])],
        init,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tidal.modelgen"
    )
    model.ir_version = 8
    out, digest, nbytes = _save(model, path)
    return ModelInfo(
        out, digest, nbytes, input_name, (-1, in_channels, size, size), output_name, (-1, classes)
    )


# Where the examples fetch their engines: the in-cluster HTTP model store, or a bucket.
EXAMPLE_STORE_ROOTS = re.compile(r"^(?:http://models\.tidal-system\.svc/|s3://[^/]+/)")


def _uris(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["uri"]] if isinstance(node.get("uri"), str) else []
        return found + [u for value in node.values() for u in _uris(value)]
    if isinstance(node, list):
        return [u for value in node for u in _uris(value)]
    return []


# Every ONNX model the examples of this version fetch (example_model_names(examples/), kept
# equal by tests/runtime/test_modelgen.py): the upload's list where no checkout is at hand.
EXAMPLE_MODELS = (
    "classifier-v1.onnx",
    "classifier-v2.onnx",
    "embedder.onnx",
    "fraud.onnx",
    "mlp-small.onnx",
    "ranker.onnx",
    "recommend.onnx",
    "search.onnx",
    "translate-de.onnx",
)


def example_model_names(examples: Path | None = None) -> list[str]:
    """Every ONNX model the manifests under ``examples`` fetch from the model store, as a path
    under the store's root (sorted, each once); ``None``: those of the shipped examples
    (:data:`EXAMPLE_MODELS`). TensorRT plans are not among them: they are built for a GPU and
    a TensorRT version (runtime/BUILD.md), not generated."""
    if examples is None:
        return sorted(EXAMPLE_MODELS)
    names: set[str] = set()
    for path in sorted(examples.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for uri in _uris(doc):
                root = EXAMPLE_STORE_ROOTS.match(uri)
                if root and uri.endswith(".onnx"):
                    names.add(uri[root.end() :])
    return sorted(names)


def write_example_models(examples: Path | None, out_dir: Path) -> list[tuple[str, ModelInfo]]:
    """Each example's ONNX model under ``out_dir`` at its path in the store: an MLP of the
    default shape (what the examples' traffic sends), a seed of its own per file."""
    names = example_model_names(examples)
    if not names:
        raise ValueError(f"no manifest under {examples} fetches an .onnx model from a store")
    return [(name, write_mlp(out_dir / name, seed=seed)) for seed, name in enumerate(names, 1)]


def upload_example_models(
    examples: Path | None,
    bucket: str,
    work_dir: Path,
    endpoint: str | None = None,
    prefix: str = "",
    region: str = "us-east-1",
) -> list[tuple[str, ModelInfo]]:
    """Make every example's ONNX model in ``work_dir`` and put each into ``bucket`` at
    ``prefix`` + its path, through the runtime's S3 client (what the pods read with).
    Credentials: the standard AWS variables. Raises ``RuntimeError`` naming the object and
    the store's answer."""
    import obstore  # the modelgen extra has it; only an upload needs it

    from .config import S3Spec
    from .storage import make_s3_store, s3_reason

    spec = S3Spec(endpoint=endpoint, region=region)
    store = make_s3_store(spec, bucket, prefix.strip("/") or None)
    made = write_example_models(examples, work_dir)
    for name, info in made:
        try:
            obstore.put(store, name, info.path)
        except Exception as exc:
            where = endpoint or f"AWS S3 ({region})"
            key = f"{prefix.strip('/')}/{name}".lstrip("/")
            raise RuntimeError(
                f"upload of s3://{bucket}/{key} to {where}: {s3_reason(exc)}"
            ) from exc
    return made


EXAMPLES_HELP = "the manifests, e.g. examples (default: the examples this version ships)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidal.runtime.modelgen")
    sub = parser.add_subparsers(dest="kind", required=True)
    mlp = sub.add_parser("mlp", help="a multi-layer perceptron")
    mlp.add_argument("out")
    mlp.add_argument("--inputs", type=int, default=16)
    mlp.add_argument("--hidden", type=int, default=64)
    mlp.add_argument("--outputs", type=int, default=4)
    mlp.add_argument("--layers", type=int, default=2)
    mlp.add_argument("--seed", type=int, default=0)
    mlp.add_argument("--bytes", type=int, default=None, help="choose --hidden for this file size")
    conv = sub.add_parser("convnet", help="a small convolutional network")
    conv.add_argument("out")
    conv.add_argument("--channels", type=int, default=8)
    conv.add_argument("--size", type=int, default=16)
    conv.add_argument("--classes", type=int, default=10)
    conv.add_argument("--seed", type=int, default=0)
    ex = sub.add_parser("examples", help="every example's ONNX models, into a directory")
    ex.add_argument("out")
    ex.add_argument("--examples", default=None, help=EXAMPLES_HELP)
    up = sub.add_parser(
        "upload", help="every example's ONNX models, made and put into an S3-compatible bucket"
    )
    up.add_argument("--bucket", required=True)
    up.add_argument("--endpoint", default=None, help="e.g. http://127.0.0.1:7070; none: AWS")
    up.add_argument("--prefix", default="", help="keys under this prefix (default: the root)")
    up.add_argument("--region", default=os.environ.get("AWS_REGION", "us-east-1"))
    up.add_argument("--examples", default=None, help=EXAMPLES_HELP)
    args = parser.parse_args(argv)
    if args.kind in ("examples", "upload"):
        return _examples_command(parser, args)
    if args.kind == "mlp":
        hidden = args.hidden
        if args.bytes is not None:
            hidden = mlp_hidden_for_bytes(args.bytes, args.inputs, args.outputs, args.layers)
        info = write_mlp(args.out, args.inputs, hidden, args.outputs, args.layers, args.seed)
    else:
        info = write_convnet(args.out, args.channels, args.size, args.classes, seed=args.seed)
    print(f"{info.sha256}  {info.size_bytes}  {info.path}")
    return 0


def _examples_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    examples = None if args.examples is None else Path(args.examples)
    if examples is not None and not examples.is_dir():
        parser.error(f"--examples {examples}: no such directory")
    try:
        if args.kind == "examples":
            made = write_example_models(examples, Path(args.out))
        else:
            with tempfile.TemporaryDirectory(prefix="tidal-models-") as work:
                made = upload_example_models(
                    examples, args.bucket, Path(work), args.endpoint, args.prefix, args.region
                )
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, info in made:
        print(f"{info.sha256}  {info.size_bytes}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def write_digits_build_inputs(root: Path) -> Path:
    """What a digits build needs, under ``root``: the trained MLP (``digits.onnx``), a
    representative calibration set (the training digits, ``calibration.npz``), a degenerate
    one (64 blank images, ``blank.npz``) and the labelled validation set (held-out digits,
    ``validation.npz``). Returns ``root``."""
    data = digits_split(seed=0)
    write_digits_mlp(root / "digits.onnx", data, hidden=(64,), seed=0)
    np.savez(root / "calibration.npz", input=data.train_x)
    np.savez(root / "blank.npz", input=np.zeros((64, 64), dtype=np.float32))
    np.savez(root / "validation.npz", input=data.test_x, labels=data.test_y)
    return root
