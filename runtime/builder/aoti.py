"""The torch (AOTInductor) builder: from a ``torch.export`` program, one ``.pt2`` package per
precision for one GPU architecture (or ``cpu``), in the layout the runtime's torch backend
loads (:mod:`tidal.runtime.backends.torch_aoti`), each gated against the FP32 source.

Source: an ``ExportedProgram`` saved by ``torch.export.save``. It is what AOTInductor compiles,
it carries its graph, weights and dynamic dimensions in a versioned format that
``torch.export.load`` reads without running any of the user's Python (``torch.save`` of a module
pickles references to the user's classes), and the ``.pt2`` name is torch's own.  The source's
batch axis must be dynamic (``torch.export.Dim``) over at least the profiles' min..max.

Per precision (:data:`tidal.runtime.builder.plan.TORCH_SCHEMES`), the program is unlifted
(``ExportedProgram.module()``, on the target device), changed as a graph, exported again with the
batch axis dynamic up to the profiles' max, and compiled by AOTInductor
(:func:`tidal.runtime.builder.pt2.build_package`): ``fp16``/``bf16`` cast the parameters
and buffers.  Inputs are cast in and outputs cast back, so every package has the source's
interface and one model configuration serves any of them.  ``fp8`` (each linear layer whose in
and out features are multiples of 16 as a float8 e4m3 matrix product, ``torch._scaled_mm``,
per-tensor weight scale, per-call per-tensor activation scale; the rest bf16) is here as an
eager module (:meth:`TorchAOTIMaker.precision_module`, checked on an H200 by tests/gpu) but the
spec does not offer it: its packages compiled and then did not load (the compiled model had no
constant for the 0-dim scales its tidal section carried; runtime/BUILD.md).

The reference is the FP32 source run eagerly on the same device (TF32 off: torch's default).
Each package is measured as it will be served: loaded by the runtime's torch backend (weights
staged, CUDA graphs captured), selected for this GPU and torch as the runtime selects, run
through ``infer`` (the call the batcher makes) at the profiles' min, opt and max batch and over
the validation set.

Torch is imported here only, and only when a torch build runs (:func:`engine_maker`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from .datasets import batches, load_set
from .gate import Reference, gate_output, validation_labels
from .plan import ServedModel
from .spec import BuildSpec, ModelError

Array = np.ndarray[Any, Any]
# The float8 (e4m3) format's largest finite value.
FP8_MAX = 448.0
# torch._scaled_mm's shape rule on Hopper: the inner and the output dimension multiples of 16.
FP8_ALIGN = 16
_NUMPY_OF_TORCH = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}


@dataclass(frozen=True)
class SourceInput:
    name: str
    rows: tuple[int, int]  # the batch range the source was exported for (hi: 2**62 if unbounded)
    shape: tuple[int, ...]  # the non-batch dimensions (static)
    dtype: Any  # numpy


def batch_range(spec: BuildSpec) -> tuple[int, int, int]:
    """(min, opt, max) of the batch axis over every profile (they must agree)."""
    points = {(p.min[0], p.opt[0], p.max[0]) for p in spec.profiles}
    if len(points) != 1:
        raise ModelError(
            "profiles: the torch builder makes one batch dimension for every input; the "
            f"profiles' batch axes differ: {sorted(points)}"
        )
    return points.pop()


def fp8_linear(x: Any, weight: Any, weight_scale: Any, bias: Any) -> Any:
    """``linear`` with float8 operands: x is quantized per call with one scale for the whole
    tensor (its absolute maximum over 448), the weight ahead of time; the product accumulates
    in fp32 and comes out bf16 (bias added there)."""
    import torch

    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    scale = (rows.abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    x8 = (rows.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(
        x8,
        weight.t(),  # column-major, as cuBLASLt's fp8 kernels want the second operand
        scale_a=scale,
        scale_b=weight_scale,
        bias=bias,
        out_dtype=torch.bfloat16,
    )
    return out.reshape(*shape[:-1], weight.shape[0])


class TorchAOTIMaker:
    """The torch builder as :func:`tidal.runtime.builder.build.build` drives it."""

    def __init__(self, spec: BuildSpec) -> None:
        from ..backends.torch_aoti import import_torch
        from ..errors import EngineLoadError

        self.spec = spec
        try:
            self.torch = import_torch()
        except EngineLoadError as exc:
            raise ModelError(f"backend: {exc.message}") from None
        self.device: Any = None
        self._program: Any = None
        self._inputs: list[SourceInput] = []
        self._outputs: list[str] = []
        self._validation: dict[str, Array] = {}
        self._output = ""
        self._backend: Any = None
        self.batch = batch_range(spec)

    def libraries(self) -> dict[str, str]:
        torch = self.torch
        versions = {
            "torch": str(torch.__version__),
            "cuda": str(torch.version.cuda or "none"),
            "numpy": np.__version__,
        }
        for name in ("triton", "tidal"):
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                versions[name] = "none" if name == "triton" else "unknown"
        return versions

    # -- the source and its reference ------------------------------------------------------------

    def _open_device(self) -> None:
        torch, target = self.torch, self.spec.target
        if target == "cpu":
            self.device = torch.device("cpu")
            return
        if not torch.cuda.is_available():
            raise ModelError(f"target: {target} needs a CUDA GPU; torch sees none here")
        self.device = torch.device("cuda", torch.cuda.current_device())
        major, minor = torch.cuda.get_device_capability(self.device)
        if f"sm{major}{minor}" != target:
            raise ModelError(
                f"target: {target} asked, this machine's GPU ({torch.cuda.get_device_name()}) "
                f"is sm{major}{minor}: AOTInductor compiles for the GPU it runs on"
            )

    def _load_source(self, source: Path) -> None:
        torch = self.torch
        try:
            program = torch.export.load(str(source))
        except Exception as exc:  # torch raises several types for a file that is not a program
            raise ModelError(
                f"source: not an ExportedProgram saved by torch.export.save: {exc}"
            ) from None
        try:
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, self.device)
        except ImportError:  # an older torch: the unlifted module is moved instead
            pass
        self._program = program
        signature = program.graph_signature
        placeholders = {n.name: n for n in program.graph.find_nodes(op="placeholder")}
        lo_batch, _, hi_batch = self.batch
        profiles = {p.input: p for p in self.spec.profiles}
        self._inputs = []
        for name in signature.user_inputs:
            value = placeholders[name].meta.get("val")
            dtype = _NUMPY_OF_TORCH.get(str(getattr(value, "dtype", "")).removeprefix("torch."))
            if dtype is None or not hasattr(value, "shape") or len(value.shape) < 1:
                raise ModelError(
                    f"source: input {name!r} ({getattr(value, 'dtype', type(value))}) is not a "
                    "tensor with a batch axis of a type the runtime feeds"
                )
            rows = self._rows_of(value.shape[0], program.range_constraints)
            if not rows[0] <= lo_batch <= hi_batch <= rows[1]:
                raise ModelError(
                    f"profiles: the source takes input {name!r} with a batch of {rows[0]}.."
                    f"{rows[1]} rows, the profiles ask for {lo_batch}..{hi_batch}: export it "
                    "with a torch.export.Dim on axis 0 that covers them"
                )
            shape = tuple(value.shape[1:])
            if not all(isinstance(d, int) for d in shape):
                raise ModelError(
                    f"source: input {name!r} has dynamic dimensions beyond the batch axis "
                    f"{shape}; the torch builder makes only the batch axis dynamic"
                )
            profile = profiles.get(name)
            if profile is not None:
                for point in ("min", "opt", "max"):
                    asked = tuple(getattr(profile, point)[1:])
                    if asked != shape:
                        raise ModelError(
                            f"profiles: input {name!r} has dimensions {list(shape)} after the "
                            f"batch axis, the profile's {point} asks for {list(asked)}"
                        )
            self._inputs.append(SourceInput(name, rows, shape, dtype))
        unknown = sorted(set(profiles) - {i.name for i in self._inputs})
        if unknown:
            raise ModelError(
                f"profiles: the model has no input {unknown[0]!r} (its inputs: "
                f"{[i.name for i in self._inputs]})"
            )
        count = len(signature.user_outputs)
        self._outputs = ["output"] if count == 1 else [f"output{i}" for i in range(count)]

    @staticmethod
    def _rows_of(dim: Any, constraints: Any) -> tuple[int, int]:
        if isinstance(dim, int):
            return dim, dim
        bounds = constraints.get(dim.node.expr)
        if bounds is None:
            return 1, 1 << 62
        upper = bounds.upper
        return int(bounds.lower), int(upper) if upper.is_finite else 1 << 62

    def open_source(self, source: Path) -> Any:
        """Load the source program onto the target device and check it against the profiles;
        returns it (an ``ExportedProgram``)."""
        self._open_device()
        self._load_source(source)
        return self._program

    def reference(self, source: Path, validation_file: Path) -> Reference:
        self.open_source(source)
        self._output = gate_output(self.spec.gate.output, self._outputs)
        self._validation = load_set(validation_file, self._inputs, "validation")
        labels = validation_labels(self.spec.validation.labels, self._validation)
        module = self._program.module()
        expected = self._run_eager(module)
        samples = int(self._validation[self._inputs[0].name].shape[0])
        return Reference(self._output, expected, labels, samples)

    def _chunks(self) -> list[dict[str, Array]]:
        """The validation set in batches the packages take (at most the profiles' max)."""
        size = min(self.spec.validation.batch_size, self.batch[2])
        return list(batches(self._validation, self._inputs, size))

    def _run_eager(self, module: Any) -> Array:
        torch = self.torch
        index = self._outputs.index(self._output)
        parts = []
        with torch.no_grad():
            for chunk in self._chunks():
                args = [torch.from_numpy(chunk[i.name]).to(self.device) for i in self._inputs]
                outs = module(*args)
                outs = outs if isinstance(outs, list | tuple) else [outs]
                parts.append(outs[index].float().cpu().numpy())
        return np.concatenate(parts, axis=0)

    # -- one package ------------------------------------------------------------------------------

    def precision_module(self, precision: str) -> Any:
        """The source, unlifted on the device, changed for ``precision`` (inputs cast in,
        outputs cast back to the source's dtypes)."""
        torch = self.torch
        module = self._program.module()
        if precision == "fp32":
            return module
        # The unlifted module's parameters are the program's own: casting them in place would
        # change the source for every later precision (and the FP32 reference).
        module = copy.deepcopy(module)
        if precision == "fp8":
            major, minor = (
                torch.cuda.get_device_capability(self.device)
                if self.device.type == "cuda"
                else (0, 0)
            )
            if (major, minor) < (8, 9):
                raise ModelError(
                    f"precisions: fp8 needs a GPU of sm89 or newer (float8 matrix products); "
                    f"the target is {self.spec.target}"
                )
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}[precision]
        originals = self._fp8_weights(module) if precision == "fp8" else {}
        module.to(dtype)
        if originals:
            self._use_fp8(module, originals)
        cast_boundary(torch, module, dtype)
        return module

    def _fp8_weights(self, module: Any) -> dict[Any, Any]:
        """The linear nodes that fit float8 matrix products, with their FP32 weights."""
        torch = self.torch
        fits = {}
        for node in module.graph.find_nodes(
            op="call_function", target=torch.ops.aten.linear.default
        ):
            weight = node.args[1]
            if getattr(weight, "op", None) != "get_attr":
                continue
            tensor = module.get_parameter(weight.target)
            out_features, in_features = tensor.shape
            if in_features % FP8_ALIGN == 0 and out_features % FP8_ALIGN == 0:
                fits[node] = tensor.detach().float().clone()
        return fits

    def _use_fp8(self, module: Any, originals: dict[Any, Any]) -> None:
        torch = self.torch
        graph = module.graph
        for index, (node, weight) in enumerate(originals.items()):
            scale = (weight.abs().amax() / FP8_MAX).clamp(min=1e-12)
            quantized = (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            module.register_buffer(f"fp8_{index}_weight", quantized)
            module.register_buffer(f"fp8_{index}_scale", scale.float())
            bias = node.args[2] if len(node.args) > 2 else None
            with graph.inserting_before(node):
                w = graph.get_attr(f"fp8_{index}_weight")
                s = graph.get_attr(f"fp8_{index}_scale")
                new = graph.call_function(fp8_linear, (node.args[0], w, s, bias))
            old_weight = node.args[1]
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            if not old_weight.users:
                graph.erase_node(old_weight)
                owner, _, leaf = old_weight.target.rpartition(".")
                parent = module.get_submodule(owner) if owner else module
                del parent._parameters[leaf]  # the FP32 weight is not carried in the package
        graph.lint()
        module.recompile()

    def make(self, precision: str, engine: Path, calibration_file: Path | None) -> int | None:
        from .pt2 import build_package

        torch = self.torch
        _, opt, hi = self.batch
        if hi < 2:
            raise ModelError("profiles: the torch builder needs a max batch of 2 or more")
        module = self.precision_module(precision)
        rows = min(max(2, opt), hi)  # an example of 1 row would pin the batch axis to 1
        generator = torch.Generator().manual_seed(0)
        examples = tuple(
            torch.randn((rows, *i.shape), generator=generator)
            .to(torch.from_numpy(np.empty(0, i.dtype)).dtype)
            .to(self.device)
            for i in self._inputs
        )
        try:
            path = build_package(
                torch,
                module,
                examples,
                [i.name for i in self._inputs],
                self._outputs,
                engine.parent,
                precision=precision,
                max_batch_size=hi,
            )
        except ModelError:
            raise
        except Exception as exc:  # export and inductor raise many types
            raise ModelError(
                f"precisions: {precision}: torch could not export or compile the model: "
                f"{type(exc).__name__}: {str(exc)[:800]}"
            ) from None
        if path != engine:
            path.replace(engine)
        return None

    # -- measuring a package as the runtime serves it --------------------------------------------

    def _runtime_backend(self) -> Any:
        if self._backend is None:
            from ..backends.torch_aoti import TorchAOTIBackend

            index = "cpu" if self.device.type == "cpu" else self.device.index
            self._backend = TorchAOTIBackend(index, stream_slots=1)
        return self._backend

    def evaluate(self, engine: Path, precision: str) -> Array:
        from ..core.engines import describe_engine, select_engine

        backend = self._runtime_backend()
        model = ServedModel(self.spec.model, self.batch[2], (precision,))
        descriptor = describe_engine(str(engine))
        chosen = select_engine([descriptor], backend.target(model))
        if chosen.chosen is None:
            raise ModelError(f"the runtime would not select {engine.name}: {chosen.reason}")
        try:
            loaded = backend.load(engine, descriptor, model, 0)
        except Exception as exc:  # EngineLoadError, or the AOTI loader's RuntimeError
            raise ModelError(
                f"precisions: {precision}: the runtime's torch backend cannot load "
                f"{engine.name}: {type(exc).__name__}: {str(exc)[:800]}"
            ) from None
        try:
            lo, opt, hi = self.batch
            for point, rows in (("min", lo), ("opt", opt), ("max", hi)):
                feed = {i.name: np.zeros((rows, *i.shape), dtype=i.dtype) for i in self._inputs}
                try:
                    loaded.infer(feed)
                except Exception as exc:
                    raise ModelError(
                        f"profiles: {point}: the package does not run a batch of {rows}: {exc}"
                    ) from None
            parts = [loaded.infer(chunk)[self._output] for chunk in self._chunks()]
        finally:
            loaded.close()
        return np.concatenate(parts, axis=0).astype(np.float32)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


def cast_boundary(torch: Any, module: Any, dtype: Any) -> None:
    """Cast the floating inputs of an unlifted program to ``dtype`` as they enter and its
    floating outputs back to their source dtypes as they leave (the graph is edited in place)."""
    graph = module.graph
    for placeholder in list(graph.find_nodes(op="placeholder")):
        value = placeholder.meta.get("val")
        if value is None or not getattr(value, "is_floating_point", lambda: False)():
            continue
        with graph.inserting_after(placeholder):
            cast = graph.call_method("to", (placeholder, dtype))
        placeholder.replace_all_uses_with(cast, delete_user_cb=lambda user, c=cast: user is not c)
    output = next(iter(graph.find_nodes(op="output")))
    results = output.args[0]
    flat = list(results) if isinstance(results, list | tuple) else [results]
    back = []
    with graph.inserting_before(output):
        for node in flat:
            value = getattr(node, "meta", {}).get("val")
            if value is not None and getattr(value, "is_floating_point", lambda: False)():
                back.append(graph.call_method("to", (node, value.dtype)))
            else:
                back.append(node)
    output.args = (type(results)(back) if isinstance(results, list | tuple) else back[0],)
    graph.lint()
    module.recompile()
