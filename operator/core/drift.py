"""Drift: whether a live child still holds what the operator applied, and when to look again.

The operator owns exactly the fields it sends in its server-side apply. A live child has more:
defaults the API server fills in (a container's ``imagePullPolicy``, a Service's ``clusterIP``),
fields other controllers write (``status``, the Deployment's revision annotation) and bookkeeping
(``resourceVersion``, ``managedFields``). None of that is drift, and an apply would not change
it either. A child has drifted when a field of the desired object is absent from the live one or
holds another value there: someone edited the image, removed a label, changed a port.

:func:`trim_child` keeps what is needed of a live child to answer that (its labels, annotations,
owner references, ``spec`` and ``data``); :func:`find_drift` compares, leaf by leaf of the desired
object, and names the first field that differs (the reason). ``spec.replicas`` is compared like
any other field: the replica count the operator applies (the control loop's, or the live count
before the loop has decided) is the one that holds.

:func:`resync_due` spreads the periodic resync over its period: each key has its own offset in
the period (a stable hash of the key), so a thousand services are looked at a few per second
instead of all at once.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

# Kinds whose owned fields :func:`find_drift` knows how to compare (any other: unknown).
COMPARED_KINDS = frozenset({"ConfigMap", "Deployment", "Service"})
# Parts of metadata the operator sets besides name and namespace (its identity).
_OWNED_METADATA = ("labels", "annotations", "ownerReferences")
# What identifies an element of a list of objects, in order of preference (containers, env,
# ports and volumes by name, volume mounts by name or path, owner references by uid). A list
# whose elements have none of them (tolerations, command) is compared element by element and
# must have the same length: Kubernetes treats such lists as a whole.
_IDENTITY = ("name", "uid", "mountPath", "containerPort", "port")
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


def trim_child(body: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`find_drift` reads of a live child: its owned metadata, ``spec`` and ``data``
    (no status, no bookkeeping; status-only updates leave it unchanged)."""
    meta = body.get("metadata") or {}
    out: dict[str, Any] = {"metadata": {k: meta[k] for k in _OWNED_METADATA if k in meta}}
    for part in ("spec", "data"):
        if part in body:
            out[part] = body[part]
    return out


def find_drift(desired: Mapping[str, Any], live: Mapping[str, Any]) -> str | None:
    """The first field the operator owns whose live value differs from the desired one (its
    path, e.g. ``spec.template.spec.containers[runtime].image``); None: no drift.

    ``live`` is the child as the API shows it (whole or :func:`trim_child`-ed). Fields only the
    live object has are not compared; resource quantities compare by value (``1Gi`` is
    ``1024Mi``), since the API server stores them in its canonical form; an empty string or
    list the live object leaves out is no drift (the API server drops them).
    """
    meta = desired.get("metadata") or {}
    live_meta = live.get("metadata") or {}
    for k in _OWNED_METADATA:
        if k in meta:
            found = _diff(meta[k], live_meta.get(k, _MISSING), f"metadata.{k}")
            if found is not None:
                return found
    for part in ("spec", "data"):
        if part in desired:
            found = _diff(desired[part], live.get(part, _MISSING), part)
            if found is not None:
                return found
    return None


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _diff(want: Any, have: Any, path: str) -> str | None:
    if have is _MISSING and (want == "" or want == []):
        return None  # the API server leaves out empty strings and lists (omitempty)
    if isinstance(want, Mapping):
        if not isinstance(have, Mapping):
            return path
        for k, v in want.items():
            found = _diff(v, have.get(k, _MISSING), f"{path}.{k}")
            if found is not None:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(have, list):
            return path
        return _diff_list(want, have, path)
    if want == have and type(want) is type(have):
        return None
    if _is_quantity_path(path) and _same_quantity(want, have):
        return None
    return path


def _diff_list(want: list[Any], have: list[Any], path: str) -> str | None:
    ident = _identity(want)
    if ident is None:
        if len(want) != len(have):
            return path
        for i, (w, h) in enumerate(zip(want, have, strict=True)):
            found = _diff(w, h, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    by_id = {
        item.get(ident): item for item in reversed(have) if isinstance(item, Mapping)
    }  # the first of duplicates wins
    for item in want:
        found = _diff(item, by_id.get(item[ident], _MISSING), f"{path}[{item[ident]}]")
        if found is not None:
            return found
    return None


def _identity(items: list[Any]) -> str | None:
    """The key identifying every element of a list of objects (None: compare by position)."""
    if not items or not all(isinstance(i, Mapping) for i in items):
        return None
    for key in _IDENTITY:
        values = [i.get(key) for i in items]
        if None not in values and len(set(map(repr, values))) == len(values):
            return key
    return None


def _is_quantity_path(path: str) -> bool:
    return ".resources." in path or path.endswith(".sizeLimit")


def _same_quantity(a: Any, b: Any) -> bool:
    qa, qb = _quantity(a), _quantity(b)
    return qa is not None and qa == qb


def _quantity(value: Any) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    match = _QUANTITY.match(value.strip())
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation:
        return None
    if exponent is not None:
        amount *= Decimal(10) ** int(exponent)
    return amount * _SUFFIX[suffix]


K = TypeVar("K")


def resync_offset(key: Any, period: float) -> float:
    """Where in each resync period ``key`` is looked at: a stable hash of the key (the same in
    every process and run), so the period's resyncs are spread evenly over it."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * period


def resync_due(
    offsets: Mapping[K, float] | Iterable[tuple[K, float]],
    period: float,
    since: float,
    now: float,
) -> list[K]:
    """The keys whose resync fell in ``(since, now]`` (seconds on one clock, ``period`` > 0):
    a key is due at every ``offset + n * period``. A window of a whole period or more holds
    every key once (a late timer catches up without a burst of repeats)."""
    pairs: Sequence[tuple[K, float]] = list(
        offsets.items() if isinstance(offsets, Mapping) else offsets
    )
    if now <= since:
        return []
    if now - since >= period:
        return [k for k, _ in pairs]
    start, end = since % period, now % period
    if start <= end:
        return [k for k, off in pairs if start < off <= end]
    return [k for k, off in pairs if off > start or off <= end]  # the window wraps around
