"""Writing the ``.pt2`` packages the runtime's torch backend loads
(:mod:`tidal.runtime.backends.torch_aoti`, whose docstring describes the layout): export a module,
lay out its constants in one aligned blob, AOTInductor-compile it without its weights, and append
the tidal section (manifest and blob).  The backend keeps the reading side (the manifest's types
and parser, the section's reader); the serving runtime imports none of this.
"""

from __future__ import annotations

import json
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..backends import TensorSpec
from ..backends.torch_aoti import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    TORCH_ONLY_DTYPES,
    WEIGHTS_NAME,
    ConstantEntry,
    Pt2Manifest,
    _archive_prefix,
)
from ..core.engines import parse_torch_version

ALIGN = 256


def layout_constants(
    constants: list[tuple[str, str, tuple[int, ...], int]],
) -> tuple[tuple[ConstantEntry, ...], int]:
    """Place ``(fqn, dtype, shape, nbytes)`` constants in one blob, each ``ALIGN``-aligned."""
    entries = []
    offset = 0
    for fqn, dtype, shape, nbytes in constants:
        entries.append(ConstantEntry(fqn, dtype, tuple(shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(entries), offset


def manifest_to_json(manifest: Pt2Manifest) -> str:
    def tensor(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}

    return json.dumps(
        {
            "version": MANIFEST_VERSION,
            "device": manifest.device,
            "torch": manifest.torch_version,
            "inputs": [tensor(s) for s in manifest.inputs],
            "outputs": [tensor(s) for s in manifest.outputs],
            "weightsBytes": manifest.weights_bytes,
            "constants": [
                {
                    "fqn": c.fqn,
                    "dtype": c.dtype,
                    "shape": list(c.shape),
                    "offset": c.offset,
                    "nbytes": c.nbytes,
                }
                for c in manifest.constants
            ],
        },
        indent=1,
    )


def layout_blob(manifest: Pt2Manifest, weights: list[bytes]) -> bytearray:
    """The weight blob: each constant's bytes at its manifest offset."""
    blob = bytearray(manifest.weights_bytes)
    for entry, data in zip(manifest.constants, weights, strict=True):
        if len(data) != entry.nbytes:
            raise ValueError(f"{entry.fqn}: {len(data)}B given, the layout says {entry.nbytes}B")
        blob[entry.offset : entry.offset + entry.nbytes] = data
    return blob


def write_tidal_section(package: Path, manifest: Pt2Manifest, blob: bytes | bytearray) -> None:
    """Append the manifest and a laid-out weight blob (stored, uncompressed) to a ``.pt2``."""
    if len(blob) != manifest.weights_bytes:
        raise ValueError(f"a blob of {len(blob)}B, the manifest says {manifest.weights_bytes}B")
    with zipfile.ZipFile(package) as archive:
        prefix = _archive_prefix(archive.namelist())
    with zipfile.ZipFile(package, "a", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(prefix + MANIFEST_NAME, manifest_to_json(manifest))
        archive.writestr(prefix + WEIGHTS_NAME, bytes(blob))


def add_tidal_section(package: Path, manifest: Pt2Manifest, weights: list[bytes]) -> None:
    """Append the manifest and the weight blob (stored, aligned) to a ``.pt2`` zip."""
    write_tidal_section(package, manifest, layout_blob(manifest, weights))


_NUMPY_NAMES: dict[Any, str] = {}


@dataclass
class PreparedPackage:
    """A model exported and laid out, not yet compiled: see :func:`build_package`."""

    exported: Any
    path: Path  # where the package goes (its name is the binding)
    manifest: Pt2Manifest
    weights: list[bytes]  # each constant's bytes, in the manifest's order


def _learn_dtype_names(torch: Any) -> None:
    """Fill :data:`_NUMPY_NAMES` (torch dtype -> the manifest's dtype name)."""
    for name in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"):
        _NUMPY_NAMES[getattr(torch, name)] = name
    for name in TORCH_ONLY_DTYPES:  # constants only: the I/O stays in numpy's types
        if hasattr(torch, name):
            _NUMPY_NAMES[getattr(torch, name)] = name


def _arch(torch: Any, device: Any) -> str:
    """The package's architecture: ``sm<major><minor>`` of a CUDA device, else ``cpu``."""
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


def prepare_package(
    torch: Any,
    module: Any,
    example_inputs: tuple[Any, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    *,
    precision: str,
    max_batch_size: int,
) -> PreparedPackage:
    """Export ``module`` (batch dimension dynamic up to ``max_batch_size``) and lay out its
    constants; nothing is compiled yet."""
    from ..core.engines import pt2_file_name
    from ..protocol import datatype_of

    _learn_dtype_names(torch)
    device = example_inputs[0].device
    batch = torch.export.Dim("batch", min=1, max=max_batch_size)
    exported = torch.export.export(
        module,
        example_inputs,
        dynamic_shapes=tuple({0: batch} for _ in example_inputs),
    )
    with torch.no_grad():
        results = module(*example_inputs)
    outs = results if isinstance(results, list | tuple) else [results]

    def spec(name: str, tensor: Any) -> TensorSpec:
        dtype = np.dtype(_NUMPY_NAMES[tensor.dtype])
        return TensorSpec(name, datatype_of(dtype), (-1, *tensor.shape[1:]))

    signature = exported.graph_signature
    state = {**exported.state_dict, **exported.constants}
    fqns = [*signature.parameters, *signature.buffers]
    tensors = [state[f].detach().contiguous().cpu() for f in fqns]
    layout, total = layout_constants(
        [
            (f, _NUMPY_NAMES[t.dtype], tuple(t.shape), t.numel() * t.element_size())
            for f, t in zip(fqns, tensors, strict=True)
        ]
    )
    manifest = Pt2Manifest(
        inputs=tuple(spec(n, t) for n, t in zip(input_names, example_inputs, strict=True)),
        outputs=tuple(spec(n, t) for n, t in zip(output_names, outs, strict=True)),
        constants=layout,
        weights_bytes=total,
        device=device.type,
        torch_version=torch.__version__,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    # The file name is the binding (one folder per model, as for TensorRT plans).
    arch = _arch(torch, device)
    path = out_dir / pt2_file_name(arch, parse_torch_version(torch.__version__), precision)
    # reshape(-1): a 0-dim constant (an fp8 scale) cannot be viewed as bytes as it is
    weights = [t.reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors]
    return PreparedPackage(exported, path, manifest, weights)


# Inductor settings for every package.  ``custom_op_libs: [":libstdc++.so.6"]`` puts
# ``-l:libstdc++.so.6`` on the wrapper library's link line, so that it links the shared
# libstdc++ the process already has.  On the H200 image $CXX (which inductor compiles with) is
# a g++ whose library folder has libstdc++.a and no libstdc++.so: the wrapper came out with
# libstdc++'s own code inside it and none in its NEEDED entries, and every load of such a
# package (constants in the .so or not, on any thread) segfaulted in std::regex in the model's
# constructor (parse_device_str); a plain ``-lstdc++`` changed nothing, this flag made them
# load and run (bench/results/gpu_bench-h200-2026-12-04b.txt).
PACKAGE_INDUCTOR_CONFIGS: dict[str, Any] = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.custom_op_libs": [":libstdc++.so.6"],
}


def compile_package(
    torch: Any, prepared: PreparedPackage, overrides: dict[str, Any] | None = None
) -> None:
    """AOTInductor-compile the exported program into ``prepared.path``, without its weights
    (``PACKAGE_INDUCTOR_CONFIGS``, updated with ``overrides``)."""
    torch._inductor.aoti_compile_and_package(
        prepared.exported,
        package_path=str(prepared.path),
        inductor_configs={**PACKAGE_INDUCTOR_CONFIGS, **(overrides or {})},
    )


def build_package(
    torch: Any,
    module: Any,
    example_inputs: tuple[Any, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    *,
    precision: str,
    max_batch_size: int,
    progress: Any = None,
) -> Path:
    """Export, compile and package ``module`` as ``<arch>-torch<ver>-<precision>.pt2``.

    Three steps (:func:`prepare_package`, :func:`compile_package`, :func:`add_tidal_section`),
    which a caller may also run one by one (bench/gpu_bench.py keeps the prepared weights on
    disk so that a build process that dies after the compile can be finished by another).  The
    batch dimension of every input is dynamic up to ``max_batch_size``; the weights go into the
    tidal section, not the compiled library.  The constants' names come from the exported
    program (parameters, then buffers), not from loading the fresh package (the load path
    checks them: ``load_constants(check_full_update=True)``).  ``progress(str)`` is told each
    step's duration as it ends.  Returns the package's path.
    """
    started = time.perf_counter()

    def step(what: str) -> None:
        if progress is not None:
            progress(f"{what} at {time.perf_counter() - started:.1f} s")

    prepared = prepare_package(
        torch,
        module,
        example_inputs,
        input_names,
        output_names,
        out_dir,
        precision=precision,
        max_batch_size=max_batch_size,
    )
    step(f"exported; {len(prepared.weights)} constants copied to the host")
    compile_package(torch, prepared)
    step(f"compiled and packaged ({prepared.path.stat().st_size} B, no weights)")
    add_tidal_section(prepared.path, prepared.manifest, prepared.weights)
    step(f"weights appended ({prepared.manifest.weights_bytes} B)")
    return prepared.path
