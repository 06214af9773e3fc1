"""The release's names, in one place: registry, image names, version, default runtime images.

Everything that names a published image reads or is checked against this module: the operator
(the runtime image an InferenceService gets when ``spec.runtime.image`` is empty, per backend),
the Helm chart (``Chart.yaml``'s appVersion, ``values.yaml``'s image repositories), the images'
Dockerfiles (their title and version labels), the publishing workflow
(``.github/workflows/images.yml`` asks ``python -m tidal.common.release``) and pyproject's
version. ``tests/charts/test_release_names.py`` fails when any of them disagrees.

Imports nothing beyond the standard library, so the workflow runs it from a bare checkout.
"""

from __future__ import annotations

import json
import sys

# The version of every deployable: the Python distribution, the chart's appVersion, the images'
# tag. A release tag is ``v<VERSION>``.
VERSION = "0.1.0"
# Where a release publishes its images (a fork's workflow publishes to its own owner instead).
REGISTRY = "ghcr.io/tidal-serving"
# Image kind (images/<kind>.Dockerfile) -> image name under the registry.
IMAGES: dict[str, str] = {
    "operator": "tidal-operator",
    "runtime-cpu": "tidal-runtime-cpu",
    "runtime": "tidal-runtime",
    # The chart's S3-compatible model store (modelStore.enabled): versitygw.
    "modelstore": "tidal-model-store",
}
# Backend -> the image kind whose runtime serves it: ONNX Runtime on CPU, TensorRT on NVIDIA's
# image. An InferenceService that names no image gets this one for its backend.
BACKEND_IMAGES: dict[str, str] = {
    "onnxruntime": "runtime-cpu",
    "tensorrt": "runtime",
}


def image(kind: str, version: str = VERSION, registry: str = REGISTRY) -> str:
    """The full reference of a published image, e.g. ghcr.io/tidal-serving/tidal-operator:0.1.0."""
    return f"{registry}/{IMAGES[kind]}:{version}"


def default_runtime_images() -> dict[str, str]:
    """Backend -> the published runtime image of this release."""
    return {backend: image(kind) for backend, kind in BACKEND_IMAGES.items()}


def main(argv: list[str]) -> int:
    """``version``: the version; ``name KIND``: the image name of a kind; no argument: all of
    it as JSON."""
    if argv == ["version"]:
        print(VERSION)
    elif len(argv) == 2 and argv[0] == "name" and argv[1] in IMAGES:
        print(IMAGES[argv[1]])
    elif not argv:
        facts = {
            "version": VERSION,
            "registry": REGISTRY,
            "images": IMAGES,
            "defaultRuntimeImages": default_runtime_images(),
        }
        print(json.dumps(facts, indent=1))
    else:
        print(f"usage: python -m tidal.common.release [version | name {{{','.join(IMAGES)}}}]")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
