"""Data sets of a build (calibration, validation): ``.npz`` files with one array per model
input, named after the input, samples along the first axis. Shared by every backend."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .spec import ModelError

Array = np.ndarray[Any, Any]


class InputLike(Protocol):
    """A model input as the data sets need it: its name and numpy type."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> Any: ...


def load_set(path: Path, inputs: Sequence[InputLike], field: str) -> dict[str, Array]:
    """The arrays of an .npz data set, one per model input, cast to the input's type."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise ModelError(f"{field}: not a readable .npz file: {exc}") from None
    missing = [t.name for t in inputs if t.name not in arrays]
    if missing:
        raise ModelError(
            f"{field}: no array for model input(s) {missing} (the file holds {sorted(arrays)})"
        )
    counts = {t.name: int(arrays[t.name].shape[0]) for t in inputs}
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise ModelError(
            f"{field}: inputs must hold the same, non-zero number of samples: {counts}"
        )
    out = {t.name: np.ascontiguousarray(arrays[t.name], dtype=t.dtype) for t in inputs}
    for name, value in arrays.items():
        if name not in out:
            out[name] = value  # labels and anything else, as stored
    return out


def samples_of(data: Mapping[str, Array], inputs: Sequence[InputLike]) -> int:
    return int(data[inputs[0].name].shape[0])


def batches(
    data: Mapping[str, Array], inputs: Sequence[InputLike], size: int, limit: int | None = None
) -> Iterator[dict[str, Array]]:
    total = samples_of(data, inputs)
    if limit is not None:
        total = min(total, limit)
    for start in range(0, total, size):
        end = min(start + size, total)
        yield {t.name: data[t.name][start:end] for t in inputs}
