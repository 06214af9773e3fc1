"""The runtime image of each pool: ``spec.runtime.image``, else the operator's for its backend.

An InferenceService that names no image gets the image of its backend (ONNX Runtime: the CPU
runtime image; TensorRT: the image on NVIDIA's TensorRT base), so an ONNX model never lands on
the TensorRT image. The defaults are this release's published images
(:mod:`tidal.common.release`); the operator's ``--runtime-image BACKEND=IMAGE`` flags (the
chart's ``runtimeImages``) replace them. The shell applies them when it parses a spec
(:func:`with_default_images`); :func:`runtime_image` falls back to the release's for a spec
built without it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...common.release import default_runtime_images
from .api import Backend, InferenceService, Runtime

DEFAULT_RUNTIME_IMAGES: Mapping[Backend, str] = {
    Backend(backend): ref for backend, ref in default_runtime_images().items()
}


def runtime_image(runtime: Runtime, images: Mapping[Backend, str] = DEFAULT_RUNTIME_IMAGES) -> str:
    """The image a pool with this runtime runs."""
    if runtime.image:
        return runtime.image
    return images.get(runtime.backend) or DEFAULT_RUNTIME_IMAGES[runtime.backend]


def with_default_images(
    isvc: InferenceService, images: Mapping[Backend, str] = DEFAULT_RUNTIME_IMAGES
) -> InferenceService:
    """The InferenceService with every pool's image set (a copy; the object is not written).

    The primary runs ``spec.runtime.image``, else its backend's image. The baseline copies the
    primary's image unless its override names one, or names another backend while the primary
    names no image: then it runs that backend's image.
    """
    spec = isvc.spec
    if spec.runtime.image:
        return isvc
    updates: dict[str, object] = {
        "runtime": spec.runtime.model_copy(update={"image": runtime_image(spec.runtime, images)})
    }
    baseline = spec.rollout.baseline
    override = baseline.runtime if baseline is not None else None
    # The override's model is built from Runtime's fields at import time: read them by name.
    given = dict(override.__dict__) if override is not None else {}
    backend: Backend | None = given.get("backend")
    if (
        baseline is not None
        and override is not None
        and not given.get("image")
        and backend is not None
        and backend is not spec.runtime.backend
    ):
        image = images.get(backend) or DEFAULT_RUNTIME_IMAGES[backend]
        baseline = baseline.model_copy(
            update={"runtime": override.model_copy(update={"image": image})}
        )
        updates["rollout"] = spec.rollout.model_copy(update={"baseline": baseline})
    return isvc.model_copy(update={"spec": spec.model_copy(update=updates)})


def parse_runtime_images(items: list[str]) -> dict[Backend, str]:
    """``BACKEND=IMAGE`` pairs (the operator's flags) as a mapping; ValueError naming a bad one."""
    out: dict[Backend, str] = {}
    for item in items:
        backend, sep, ref = item.partition("=")
        try:
            known = Backend(backend.strip())
        except ValueError:
            known = None
        if not sep or known is None or not ref.strip():
            choices = ", ".join(b.value for b in Backend)
            raise ValueError(f"{item!r}: expected BACKEND=IMAGE with BACKEND one of {choices}")
        out[known] = ref.strip()
    return out
