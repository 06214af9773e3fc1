"""The runtime image of a pool that names none: its backend's (the release's, or the operator's
``--runtime-image``), so an ONNX model never gets the TensorRT image."""

from __future__ import annotations

from typing import Any

import pytest
from isvc_fixtures import EXAMPLES, load, minimal

from tidal.common import release
from tidal.operator.__main__ import parse_args
from tidal.operator.core.api import Backend, InferenceService, parse_inference_service
from tidal.operator.core.images import (
    DEFAULT_RUNTIME_IMAGES,
    parse_runtime_images,
    with_default_images,
)
from tidal.operator.core.resources import Observed, desired_objects
from tidal.operator.shell.reconciler import Store

CPU = release.image("runtime-cpu")
TRT = release.image("runtime")
TRT_ENGINE = {"uri": "file:///models/m.sm90.plan", "backend": "tensorrt"}


def images_by_deployment(isvc: InferenceService) -> dict[str, str]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]["image"]
        for o in desired_objects(isvc, Observed())
        if o["kind"] == "Deployment"
    }


def parsed(body: dict[str, Any], images: dict[Backend, str] | None = None) -> InferenceService:
    isvc = parse_inference_service(body)
    return with_default_images(isvc, images) if images is not None else with_default_images(isvc)


def test_an_onnx_service_naming_no_image_gets_the_cpu_runtime_image() -> None:
    body = minimal()
    del body["spec"]["runtime"]  # the default backend: onnxruntime, as in tidal-runtime
    assert images_by_deployment(parsed(body)) == {"svc-primary": CPU}
    # Built without the shell's defaults (a bare parse), the release's image all the same.
    assert images_by_deployment(parse_inference_service(body)) == {"svc-primary": CPU}


def test_a_tensorrt_service_naming_no_image_gets_the_tensorrt_image() -> None:
    body = minimal(runtime={"backend": "tensorrt"})
    body["spec"]["models"][0]["engines"] = [TRT_ENGINE]
    assert images_by_deployment(parsed(body)) == {"svc-primary": TRT}


def test_a_named_image_is_kept_for_both_pools() -> None:
    body = minimal(
        runtime={"backend": "onnxruntime", "image": "registry.example.com/mine:1"},
        rollout={"baseline": {"minReplicas": 1}},
    )
    assert set(images_by_deployment(parsed(body)).values()) == {"registry.example.com/mine:1"}


def test_configured_images_replace_the_release_s_for_pools_and_gateway() -> None:
    body = load(EXAMPLES / "fleet.yaml")
    body["metadata"].update(namespace="ns", uid="u-1", generation=1)
    mine = {Backend.ONNXRUNTIME: "registry.example.com/cpu:2"}
    images = images_by_deployment(parsed(body, mine))
    assert images == {
        "catalog-primary": mine[Backend.ONNXRUNTIME],
        "catalog-gateway": mine[Backend.ONNXRUNTIME],
    }


def test_a_baseline_of_another_backend_gets_that_backend_s_image() -> None:
    body = minimal(rollout={"baseline": {"runtime": {"backend": "tensorrt"}, "minReplicas": 1}})
    body["spec"]["models"][0]["engines"].append(TRT_ENGINE)
    assert images_by_deployment(parsed(body)) == {"svc-primary": CPU, "svc-baseline": TRT}


def test_parse_runtime_images_names_a_bad_pair() -> None:
    assert parse_runtime_images(["tensorrt=a/b:1", " onnxruntime = c:2 "]) == {
        Backend.TENSORRT: "a/b:1",
        Backend.ONNXRUNTIME: "c:2",
    }
    for bad in ["torch=a:1", "tensorrt", "onnxruntime="]:
        with pytest.raises(ValueError, match="BACKEND=IMAGE"):
            parse_runtime_images([bad])


def test_operator_flags_and_env_set_the_images_over_the_release_s() -> None:
    assert parse_args([], {}).runtime_images == DEFAULT_RUNTIME_IMAGES
    env = {"TIDAL_OPERATOR_RUNTIME_IMAGES": "onnxruntime=env/cpu:1,tensorrt=env/trt:1"}
    assert parse_args([], env).runtime_images == {
        Backend.ONNXRUNTIME: "env/cpu:1",
        Backend.TENSORRT: "env/trt:1",
    }
    flags = ["--runtime-image", "tensorrt=flag/trt:2"]
    assert parse_args(flags, env).runtime_images == {
        Backend.ONNXRUNTIME: release.image("runtime-cpu"),
        Backend.TENSORRT: "flag/trt:2",
    }
    with pytest.raises(SystemExit):
        parse_args(["--runtime-image", "cuda=x:1"], {})


def test_the_shell_parses_with_its_configured_images() -> None:
    store = Store(runtime_images={Backend.ONNXRUNTIME: "configured/cpu:3"})
    isvc = store.parse(minimal())
    assert isvc.spec.runtime.image == "configured/cpu:3"
    assert images_by_deployment(isvc) == {"svc-primary": "configured/cpu:3"}
