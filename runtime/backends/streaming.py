"""Weight streaming on the torch backend: a layered model larger than its device budget (issue 46).

:class:`StreamedLayers` runs a sequence of torch modules (the layers of a model, applied one
after the other) with the first ``plan.resident`` layers on the device and the rest in pinned
host memory (:func:`tidal.runtime.core.weightstreaming.plan_layer_residency` chooses the
split).  Each streamed layer's parameters and buffers are packed into one pinned host blob; two
device slots, each the size of the largest blob, take turns: while layer *i* computes on the
compute stream from slot *i mod 2*, the copy stream fills the other slot with layer *i+1*'s
blob (one ``cudaMemcpyAsync`` from pinned memory, the copy engine's full rate).  Events order
the two streams: a layer waits for its slot's copy; a copy waits until the slot's previous
layer has finished computing.  The first streamed layer's copy starts before the resident
layers compute, so it overlaps them.  The layer runs with its tensors as views of the slot
(``torch.func.functional_call``), so nothing is allocated per layer.

Device memory at the peak: the resident layers + two slots + the activations of the largest
batch; the plan's ``device_bytes`` with ``reserve_bytes`` = the activations is within the
budget (tests/gpu/test_weight_streaming_gpu.py measures it).  Torch is passed in; this module
imports without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.weightstreaming import LayerResidency

ALIGN = 256


@dataclass(frozen=True)
class PackedTensor:
    name: str
    offset: int
    nbytes: int
    dtype: Any
    shape: tuple[int, ...]


def _layer_tensors(layer: Any) -> dict[str, Any]:
    tensors = dict(layer.named_parameters())
    tensors.update(dict(layer.named_buffers()))
    return tensors


def layer_nbytes(layer: Any) -> int:
    """The bytes a layer's packed blob takes (each tensor 256-byte aligned)."""
    total = 0
    for tensor in _layer_tensors(layer).values():
        total = -(-total // ALIGN) * ALIGN + tensor.numel() * tensor.element_size()
    return -(-total // ALIGN) * ALIGN


class StreamedLayers:
    """``layers`` applied in order, the non-resident ones streamed from pinned host memory."""

    def __init__(self, torch: Any, layers: list[Any], plan: LayerResidency, device: Any) -> None:
        self.torch = torch
        self.plan = plan
        self.device = device
        self.layers = layers
        self.copy_stream = torch.cuda.Stream(device=device)
        self.streamed_bytes_per_pass = 0
        for layer in layers[: plan.resident]:
            layer.to(device)
        self._packed: list[list[PackedTensor]] = []
        self._host: list[Any] = []
        for layer in layers[plan.resident :]:
            specs: list[PackedTensor] = []
            offset = 0
            for name, tensor in _layer_tensors(layer).items():
                offset = -(-offset // ALIGN) * ALIGN
                nbytes = tensor.numel() * tensor.element_size()
                specs.append(PackedTensor(name, offset, nbytes, tensor.dtype, tuple(tensor.shape)))
                offset += nbytes
            offset = -(-offset // ALIGN) * ALIGN
            blob = torch.empty(max(1, offset), dtype=torch.uint8, pin_memory=True)
            for spec, tensor in zip(specs, _layer_tensors(layer).values(), strict=True):
                raw = blob[spec.offset : spec.offset + spec.nbytes]
                raw.view(spec.dtype).view(spec.shape).copy_(tensor.detach().cpu())
            layer.to("meta")  # the pinned blob is now the only host copy
            self._packed.append(specs)
            self._host.append(blob)
            self.streamed_bytes_per_pass += offset
        slot_bytes = max((int(b.numel()) for b in self._host), default=0)
        self._slots = [
            torch.empty(slot_bytes, dtype=torch.uint8, device=device)
            for _ in range(2 if self._host else 0)
        ]
        self._ready = [torch.cuda.Event() for _ in self._slots]
        self._free = [torch.cuda.Event() for _ in self._slots]

    def _prefetch(self, streamed: int, compute: Any) -> None:
        """Copy streamed layer ``streamed``'s blob into its slot on the copy stream."""
        slot = streamed % 2
        blob = self._host[streamed]
        self.copy_stream.wait_event(self._free[slot])
        with self.torch.cuda.stream(self.copy_stream):
            self._slots[slot][: blob.numel()].copy_(blob, non_blocking=True)
            self._ready[slot].record(self.copy_stream)

    def _views(self, streamed: int) -> dict[str, Any]:
        slot = self._slots[streamed % 2]
        return {
            s.name: slot[s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
            for s in self._packed[streamed]
        }

    def __call__(self, x: Any) -> Any:
        torch = self.torch
        compute = torch.cuda.current_stream(self.device)
        for event in self._free:  # the slots are free once the last pass's layers computed
            event.record(compute)
        if self._host:
            self._prefetch(0, compute)
        for layer in self.layers[: self.plan.resident]:
            x = layer(x)
        for streamed, layer in enumerate(self.layers[self.plan.resident :]):
            slot = streamed % 2
            if streamed + 1 < len(self._host):
                self._prefetch(streamed + 1, compute)
            compute.wait_event(self._ready[slot])
            x = torch.func.functional_call(layer, self._views(streamed), (x,))
            self._free[slot].record(compute)
        return x

    def close(self) -> None:
        self._slots = []
        self._host = []
        self.layers = []
