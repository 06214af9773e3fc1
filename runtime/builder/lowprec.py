"""An FP32 ONNX model cast to float16 or bfloat16, for a strongly typed TensorRT build.

A strongly typed network computes in the types its ONNX model carries, so an FP16/BF16 plan
needs an FP16/BF16 model: every float initializer and float constant is cast, ``Cast`` nodes
to float cast to the low type instead, and the graph's float inputs and outputs keep FP32 at
the boundary (a ``Cast`` in, a ``Cast`` out), so that one model configuration serves every
precision's plan. Pure: a ``ModelProto`` in, a new one out.

Not done: AutoCast's rules (Model Optimizer's ``modelopt.onnx.autocast``) that keep
overflow-prone nodes (reductions, large exponents) in FP32. An operator TensorRT only takes in
FP32 fails the parse, which names the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .spec import ModelError

LOW_TYPES = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def bfloat16_bits(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(values)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def _cast_tensor(tensor: TensorProto, elem: int) -> TensorProto:
    if tensor.data_type != TensorProto.FLOAT:
        return tensor
    values = numpy_helper.to_array(tensor)
    if elem == TensorProto.FLOAT16:
        return numpy_helper.from_array(values.astype(np.float16), tensor.name)
    out = TensorProto()
    out.name = tensor.name
    out.dims.extend(values.shape)
    out.data_type = TensorProto.BFLOAT16
    out.raw_data = bfloat16_bits(values).tobytes()
    return out


def cast_model(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    """``model`` computing in ``precision`` (fp16 or bf16), FP32 at its inputs and outputs."""
    elem = LOW_TYPES.get(precision)
    if elem is None:
        raise ModelError(f"precisions: {precision}: only {sorted(LOW_TYPES)} are cast")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    if any(n.op_type in ("If", "Loop", "Scan") for n in graph.node):
        raise ModelError(
            f"precisions: {precision}: the model has subgraphs (If/Loop/Scan), which the "
            "low-precision cast does not rewrite"
        )
    initializers = [_cast_tensor(t, elem) for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(_cast_tensor(attr.t, elem))
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = elem
    floats_in = [i.name for i in graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT]
    floats_out = [o.name for o in graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    renamed = {name: f"{name}__{precision}" for name in floats_in}
    produced = {name: f"{name}__{precision}" for name in floats_out}
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in renamed:
                node.input[index] = renamed[name]
        for index, name in enumerate(node.output):
            if name in produced:
                node.output[index] = produced[name]
        # a node reading a graph output that it also is
        for index, name in enumerate(node.input):
            if name in produced:
                node.input[index] = produced[name]
    casts_in = [
        onnx.helper.make_node("Cast", [n], [renamed[n]], name=f"{n}__to_{precision}", to=elem)
        for n in floats_in
    ]
    casts_out = [
        onnx.helper.make_node(
            "Cast", [produced[n]], [n], name=f"{n}__to_fp32", to=TensorProto.FLOAT
        )
        for n in floats_out
    ]
    nodes = [*casts_in, *graph.node, *casts_out]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # types changed: TensorRT and ONNX infer them again
    return out
