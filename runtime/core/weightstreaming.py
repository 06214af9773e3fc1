"""Device-memory arithmetic for weight streaming, TensorRT engines and torch layers (pure).

TensorRT 10/11 (v2 APIs): an engine's weights split into a part that must stay resident and
``streamable_weights_size`` bytes that may be streamed from host memory during execution.
``weight_streaming_budget_v2`` is how many streamable bytes stay on the device; it can only be
set while no execution context exists.  Each execution context needs
``device_memory_size_v2`` bytes of activation memory, and streaming needs
``weight_streaming_scratch_memory_size`` more.  TensorRT's own automatic budget is wrapped as
int32 in the Python bindings, so the budget is computed here instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from .quantity import Fraction


@dataclass(frozen=True)
class EngineMemory:
    """Sizes TensorRT reports for a deserialized engine, in bytes."""

    total_weights: int
    streamable_weights: int
    activation: int
    scratch: int = 0


@dataclass(frozen=True)
class StreamingPlan:
    """The budget to set and the device bytes the engine will then occupy."""

    budget_bytes: int
    device_bytes: int
    streaming: bool
    reason: str


class DoesNotFitError(ValueError):
    """Even with every streamable weight streamed, the engine needs more than is free."""


def plan_weight_streaming(
    memory: EngineMemory,
    requested: int | Fraction | str | None,
    available_bytes: int,
) -> StreamingPlan:
    """Choose ``weight_streaming_budget_v2`` for an engine.

    ``requested``: None (keep all weights resident), a byte count, a :class:`Fraction` of the
    streamable weights, or ``"auto"`` (keep as much resident as ``available_bytes`` allows).
    ``available_bytes`` is what this engine may use on the device (budget minus other engines
    minus the reserve).
    """
    resident_floor = memory.total_weights - memory.streamable_weights
    full = memory.total_weights + memory.activation
    if memory.streamable_weights <= 0 or requested is None:
        if full > available_bytes:
            hint = (
                "it has no streamable weights"
                if memory.streamable_weights <= 0
                else "set a weightStreamingBudget to stream weights from host memory"
            )
            raise DoesNotFitError(
                f"engine needs {full}B (weights {memory.total_weights}B + activations "
                f"{memory.activation}B) but {available_bytes}B are available; {hint}"
            )
        return StreamingPlan(memory.streamable_weights, full, False, "resident:all-weights")
    minimum = resident_floor + memory.activation + memory.scratch
    if minimum > available_bytes:
        raise DoesNotFitError(
            f"engine needs at least {minimum}B even when streaming every streamable weight "
            f"(resident {resident_floor}B + activations {memory.activation}B + scratch "
            f"{memory.scratch}B) but {available_bytes}B are available"
        )
    room = available_bytes - minimum
    if requested == "auto":
        budget = min(memory.streamable_weights, room)
        reason = "auto:fill-available"
    elif isinstance(requested, Fraction):
        budget = int(memory.streamable_weights * requested.value)
        reason = f"fraction:{requested.value:.0%}"
    elif isinstance(requested, int):
        budget = min(requested, memory.streamable_weights)
        reason = "bytes"
    else:
        raise ValueError(f"weight streaming budget {requested!r}: expected bytes, 'N%' or 'auto'")
    if budget > room:
        budget = room
        reason += ":clamped-to-available"
    streaming = budget < memory.streamable_weights
    scratch = memory.scratch if streaming else 0
    device = resident_floor + budget + memory.activation + scratch
    return StreamingPlan(budget, device, streaming, reason)


@dataclass(frozen=True)
class LayerResidency:
    """Which layers of a layered model stay on the device, and what the rest cost to stream.

    The first ``resident`` layers stay on the device; every later one is copied from pinned host
    memory into one of two device slots (double buffering: the next layer's copy runs while this
    one computes), each the size of the largest streamed layer."""

    resident: int
    resident_bytes: int
    slot_bytes: int
    device_bytes: int
    streamed_bytes: int
    reason: str

    @property
    def streaming(self) -> bool:
        return self.streamed_bytes > 0


def plan_layer_residency(
    layer_bytes: list[int], budget_bytes: int, reserve_bytes: int = 0
) -> LayerResidency:
    """The longest prefix of ``layer_bytes`` that can stay resident within ``budget_bytes``.

    ``reserve_bytes`` is what the budget must also hold at the peak besides weights: activations
    and workspace at the target batch size.  The device then holds the resident prefix, two
    streaming slots of the largest streamed layer and the reserve; all of that is
    ``device_bytes`` <= ``budget_bytes``.  Raises :class:`DoesNotFitError` when even streaming
    every layer does not fit."""
    if any(b < 0 for b in layer_bytes):
        raise ValueError(f"layer sizes must not be negative: {layer_bytes}")
    total = sum(layer_bytes)
    if total + reserve_bytes <= budget_bytes:
        return LayerResidency(
            len(layer_bytes), total, 0, total + reserve_bytes, 0, "resident:all-layers"
        )
    best: LayerResidency | None = None
    for resident in range(len(layer_bytes) - 1, -1, -1):
        kept = sum(layer_bytes[:resident])
        slot = max(layer_bytes[resident:])
        device = kept + 2 * slot + reserve_bytes
        if device <= budget_bytes:
            best = LayerResidency(
                resident,
                kept,
                slot,
                device,
                total - kept,
                f"stream:{len(layer_bytes) - resident}-of-{len(layer_bytes)}-layers",
            )
            break
    if best is None:
        slot = max(layer_bytes, default=0)
        raise DoesNotFitError(
            f"streaming every layer needs {2 * slot + reserve_bytes}B (two slots of {slot}B + "
            f"reserve {reserve_bytes}B) but the budget is {budget_bytes}B"
        )
    return best
