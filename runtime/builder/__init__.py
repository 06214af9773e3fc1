"""The offline engine builder (``python -m tidal.runtime.builder``): from a source ONNX model, the
engines a build spec asks for, each gated on its accuracy against the FP32 reference and written
with a manifest under the naming scheme (runtime/BUILD.md).

Pure parts: :mod:`.spec` (what is asked), :mod:`.plan` (names, build keys, manifests),
:mod:`.gate` (accuracy metrics and the verdict). Shell: :mod:`.onnxrt` (ONNX Runtime's
optimizer and static INT8 quantization), :mod:`.build` (fetch, build, gate, publish).
The serving runtime imports none of it.
"""
