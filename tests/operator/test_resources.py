"""desired_objects and friends: the children an InferenceService should have."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from isvc_fixtures import (
    accepted_paths,
    degraded_cases,
    example_paths,
    load,
    minimal,
)
from pydantic import ValidationError

from tidal.operator.core import api
from tidal.operator.core.resources import (
    ANNOTATION_APPLIED_HASH,
    MAX_ENV_STRING_BYTES,
    Observed,
    desired_objects,
    desired_replicas,
    explain_pool_failure,
    find_spec_problems,
    pools_of,
    render_runtime_config,
    secret_fields,
)
from tidal.operator.core.rules import find_spec_warnings
from tidal.runtime.config import RuntimeConfig

PRIMARY, BASELINE = api.PoolName.PRIMARY, api.PoolName.BASELINE
BASELINE_SPEC = {
    "baseline": {"models": [{"name": "m", "engines": [{"uri": "file:///models/m-v1.onnx"}]}]}
}


def _isvc(**spec: Any) -> api.InferenceService:
    return api.parse_inference_service(minimal(**spec))


def _by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


def test_single_pool_children_and_names() -> None:
    objs = _by_key(desired_objects(_isvc(), Observed()))
    assert set(objs) == {
        ("ConfigMap", "svc-primary-config"),
        ("Deployment", "svc-primary"),
        ("Service", "svc"),
    }


def test_baseline_adds_a_second_pool() -> None:
    objs = _by_key(desired_objects(_isvc(rollout=BASELINE_SPEC), Observed()))
    assert ("Deployment", "svc-baseline") in objs
    assert ("ConfigMap", "svc-baseline-config") in objs


def test_every_child_is_owned_and_labelled() -> None:
    for obj in desired_objects(_isvc(rollout=BASELINE_SPEC), Observed()):
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        (owner,) = meta["ownerReferences"]
        assert owner == {
            "apiVersion": "serving.tidal.dev/v1alpha1",
            "kind": "InferenceService",
            "name": "svc",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert meta["labels"][api.LABEL_ISVC] == "svc"
        assert ANNOTATION_APPLIED_HASH in meta["annotations"]


def test_deployment_selects_on_service_and_pool_only() -> None:
    dep = _by_key(desired_objects(_isvc(), Observed()))[("Deployment", "svc-primary")]
    assert dep["spec"]["selector"] == {
        "matchLabels": {api.LABEL_ISVC: "svc", api.LABEL_POOL: "primary"}
    }
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels[api.LABEL_ROLE] == "serving"
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


@pytest.mark.parametrize(
    ("observed", "rollout", "pool"),
    [
        (Observed(), {}, "primary"),
        (Observed(active_pool=BASELINE), {}, "primary"),  # no baseline: primary regardless
        (Observed(active_pool=BASELINE), BASELINE_SPEC, "baseline"),
        (Observed(), {**BASELINE_SPEC, "activePool": "baseline"}, "baseline"),
        (Observed(active_pool=BASELINE), {**BASELINE_SPEC, "activePool": "primary"}, "primary"),
    ],
)
def test_service_selector_follows_the_active_pool(
    observed: Observed, rollout: dict[str, Any], pool: str
) -> None:
    svc = _by_key(desired_objects(_isvc(rollout=rollout), observed))[("Service", "svc")]
    assert svc["spec"]["selector"] == {
        api.LABEL_ISVC: "svc",
        api.LABEL_POOL: pool,
        api.LABEL_ROLE: "serving",
    }


def test_split_traffic_selects_both_pools() -> None:
    objs = desired_objects(_isvc(rollout=BASELINE_SPEC), Observed(split=True))
    svc = _by_key(objs)[("Service", "svc")]
    assert api.LABEL_POOL not in svc["spec"]["selector"]


def test_pod_template_contract() -> None:
    dep = _by_key(desired_objects(_isvc(), Observed()))[("Deployment", "svc-primary")]
    template = dep["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8080"
    assert annotations["prometheus.io/path"] == "/metrics"
    container = _container(dep)
    assert container["command"] == ["tidal-runtime"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TIDAL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TIDAL_PORT"]["value"] == "8080"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TIDAL_RUNTIME_CONFIG_JSON"]["valueFrom"]["configMapKeyRef"] == {
        "name": "svc-primary-config",
        "key": "runtime-config.json",
    }
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert "resources" not in container  # onnxruntime, no requests: nothing to ask for


def test_tensorrt_asks_for_gpus() -> None:
    isvc = _isvc(
        runtime={"backend": "tensorrt", "gpus": 2, "resources": {"limits": {"memory": "8Gi"}}},
        models=[{"name": "m", "engines": [{"uri": "file:///m/sm90-trt11.4-fp16.engine"}]}],
    )
    dep = _by_key(desired_objects(isvc, Observed()))[("Deployment", "svc-primary")]
    resources = _container(dep)["resources"]
    assert resources["limits"] == {"memory": "8Gi", "nvidia.com/gpu": "2"}
    assert resources["requests"] == {"nvidia.com/gpu": "2"}


def test_user_env_cannot_shadow_the_runtime_contract() -> None:
    with pytest.raises(ValidationError, match="must not be one the operator sets"):
        _isvc(runtime={"backend": "onnxruntime", "env": [{"name": "TIDAL_PORT", "value": "9"}]})
    isvc = _isvc(runtime={"backend": "onnxruntime", "env": [{"name": "EXTRA", "value": "1"}]})
    dep = _by_key(desired_objects(isvc, Observed()))[("Deployment", "svc-primary")]
    env = [(e["name"], e.get("value")) for e in _container(dep)["env"]]
    assert ("TIDAL_PORT", "8080") in env
    assert env[-1] == ("EXTRA", "1")


def test_config_change_changes_the_template_hash_but_scale_does_not() -> None:
    def template_hash(isvc: api.InferenceService, observed: Observed) -> str:
        dep = _by_key(desired_objects(isvc, observed))[("Deployment", "svc-primary")]
        return str(dep["spec"]["template"]["metadata"]["annotations"][api.ANNOTATION_CONFIG_HASH])

    base = _isvc()
    edited = _isvc(
        models=[
            {
                "name": "m",
                "maxBatchSize": 4,
                "warmup": {"batchSizes": [1]},
                "engines": [{"uri": "file:///models/m.onnx"}],
            }
        ]
    )
    assert template_hash(base, Observed()) != template_hash(edited, Observed())
    assert template_hash(base, Observed()) == template_hash(base, Observed(replicas={PRIMARY: 5}))


@pytest.mark.parametrize(
    ("spec", "observed", "pool", "expected"),
    [
        ({}, Observed(), PRIMARY, 1),  # min 1 + standby 0
        ({"autoscaling": {"minReplicas": 2, "standbyReplicas": 1}}, Observed(), PRIMARY, 3),
        (
            {"autoscaling": {"minReplicas": 2, "maxReplicas": 2, "standbyReplicas": 1}},
            Observed(),
            PRIMARY,
            2,
        ),
        ({}, Observed(replicas={PRIMARY: 7}), PRIMARY, 7),  # the autoscaler's decision
        ({"autoscaling": {"maxReplicas": 3}}, Observed(replicas={PRIMARY: 7}), PRIMARY, 3),
        ({"autoscaling": {"minReplicas": 2}}, Observed(replicas={PRIMARY: 0}), PRIMARY, 2),
        # minReplicas 0: a new service starts with one replica; the autoscaler's zero stands.
        ({"autoscaling": {"minReplicas": 0}}, Observed(), PRIMARY, 1),
        ({"autoscaling": {"minReplicas": 0}}, Observed(replicas={PRIMARY: 0}), PRIMARY, 0),
        ({"replicas": 4}, Observed(replicas={PRIMARY: 7}), PRIMARY, 4),  # manual wins
        ({"rollout": BASELINE_SPEC}, Observed(), BASELINE, 1),
        ({"rollout": BASELINE_SPEC}, Observed(replicas={BASELINE: 3}), BASELINE, 3),
        ({"rollout": BASELINE_SPEC}, Observed(replicas={BASELINE: 0}), BASELINE, 1),
    ],
)
def test_desired_replicas(
    spec: dict[str, Any], observed: Observed, pool: api.PoolName, expected: int
) -> None:
    assert desired_replicas(_isvc(**spec), pool, observed) == expected


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_rendered_config_is_a_valid_runtime_config(path: Any) -> None:
    isvc = api.parse_inference_service(load(path))
    for pool in pools_of(isvc):
        config = RuntimeConfig.model_validate(render_runtime_config(pool))
        assert config.backend == pool.runtime.backend.value
        assert [m.name for m in config.models] == [m.name for m in pool.models]


def test_rendered_config_carries_the_memory_budgets() -> None:
    isvc = api.parse_inference_service(load(example_paths()[-1]))  # the GPU example
    config = RuntimeConfig.model_validate(render_runtime_config(pools_of(isvc)[0]))
    assert config.memory.engine_cache_budget_bytes == 100 * 2**30
    assert config.memory.reserve_bytes == 4 * 2**30
    assert config.memory.weight_streaming_budget == "60%"


def test_engines_for_other_backends_are_not_passed_on() -> None:
    isvc = _isvc(
        models=[
            {
                "name": "m",
                "engines": [
                    {"uri": "file:///m/m.onnx"},
                    {"uri": "file:///m/sm90-trt11.4-fp16.engine"},
                ],
            }
        ]
    )
    (model,) = render_runtime_config(pools_of(isvc)[0])["models"]
    assert [e["uri"] for e in model["engines"]] == ["file:///m/m.onnx"]


def test_no_engine_for_the_backend_is_a_problem_that_says_what_to_fix() -> None:
    isvc = _isvc(runtime={"backend": "tensorrt"})
    (problem,) = find_spec_problems(isvc)
    assert "no engine for backend tensorrt" in problem
    assert "spec.runtime.backend" in problem


def test_unnamed_tensorrt_plan_is_a_problem() -> None:
    isvc = _isvc(
        runtime={"backend": "tensorrt"},
        models=[{"name": "m", "engines": [{"uri": "file:///m/model.plan"}]}],
    )
    problems = find_spec_problems(isvc)
    assert any("tensorrtVersion" in p for p in problems)


def test_weight_streaming_needs_tensorrt() -> None:
    isvc = _isvc(memory={"weightStreamingBudget": "50%"})
    assert any("weightStreamingBudget" in p for p in find_spec_problems(isvc))


def test_examples_have_no_problems() -> None:
    for path in example_paths():
        assert find_spec_problems(api.parse_inference_service(load(path))) == [], path


names = st.from_regex(r"[a-z][a-z0-9]{0,20}", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(
    name=names,
    min_r=st.integers(0, 5),
    extra=st.integers(0, 5),
    standby=st.integers(0, 3),
    asked=st.one_of(st.none(), st.integers(0, 50)),
    with_baseline=st.booleans(),
)
def test_desired_objects_properties(
    name: str, min_r: int, extra: int, standby: int, asked: int | None, with_baseline: bool
) -> None:
    max_r = max(1, min_r + extra, standby)
    spec: dict[str, Any] = {
        "autoscaling": {"minReplicas": min_r, "maxReplicas": max_r, "standbyReplicas": standby}
    }
    if with_baseline:
        spec["rollout"] = BASELINE_SPEC
    isvc = api.parse_inference_service(minimal(name=name, **spec))
    observed = Observed(replicas={PRIMARY: asked} if asked is not None else {})
    first = desired_objects(isvc, observed)
    # Deterministic: the same input gives the same objects (and hashes).
    assert first == desired_objects(isvc, observed)
    keys = [(o["kind"], o["metadata"]["name"]) for o in first]
    activator = 1 if min_r == 0 else 0  # a service that may reach zero: its gateway
    assert len(keys) == len(set(keys)) == (5 if with_baseline else 3) + activator
    for dep in (o for o in first if o["kind"] == "Deployment"):
        assert min_r <= dep["spec"]["replicas"] <= max_r or dep["metadata"]["name"].endswith(
            "baseline"
        )
        assert dep["spec"]["selector"]["matchLabels"].items() <= (
            dep["spec"]["template"]["metadata"]["labels"].items()
        )
    # A ConfigMap comes before the Deployment that reads it.
    kinds = [k for k, _ in keys]
    assert kinds.index("ConfigMap") < kinds.index("Deployment")


def test_an_engine_the_runtime_cannot_fetch_is_a_problem_that_says_what_to_do() -> None:
    isvc = _isvc(models=[{"name": "m", "engines": [{"uri": "gs://bucket/m.onnx"}]}])
    (problem,) = find_spec_problems(isvc)
    assert "cannot fetch gs://" in problem and "s3://" in problem and "https://" in problem


def _runtime_container(isvc: api.InferenceService) -> dict[str, Any]:
    (dep,) = [
        o
        for o in desired_objects(isvc, Observed())
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("primary")
    ]
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_s3_engines_reach_the_runtime_with_the_store_and_secret_references() -> None:
    """An s3:// engine is no problem; the store's endpoint reaches the runtime's config and the
    credentials reach its environment only by reference to the named Secret."""
    storage = {
        "s3": {
            "endpoint": "http://store.storage.svc:7070",
            "region": "eu-west-1",
            "credentialsSecret": "engine-store",
        }
    }
    isvc = _isvc(
        runtime={"backend": "onnxruntime", "storage": storage},
        models=[{"name": "m", "engines": [{"uri": "s3://engines/m/model.onnx"}]}],
    )
    assert find_spec_problems(isvc) == []
    pool = pools_of(isvc)[0]
    assert render_runtime_config(pool)["s3"] == {
        "endpoint": "http://store.storage.svc:7070",
        "region": "eu-west-1",
        "pathStyle": True,
    }
    env = {e["name"]: e for e in _runtime_container(isvc)["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "engine-store" and ref["key"] == key
        assert "value" not in env[key]
    assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env["AWS_REGION"]["value"] == "eu-west-1"


def test_secret_fields_name_where_each_secret_is_set() -> None:
    s3 = {"s3": {"credentialsSecret": "primary-store"}}
    isvc = _isvc(
        runtime={"backend": "onnxruntime", "storage": s3},
        rollout={
            "baseline": {"runtime": {"storage": {"s3": {"credentialsSecret": "baseline-store"}}}}
        },
    )
    assert secret_fields(isvc) == {
        "primary-store": "spec.runtime.storage.s3.credentialsSecret",
        "baseline-store": "spec.rollout.baseline.runtime.storage.s3.credentialsSecret",
    }


def test_a_service_without_a_store_keeps_its_config_hash() -> None:
    """No storage: nothing new in the runtime's config (existing pools are not rolled)."""
    isvc = _isvc(runtime={"backend": "onnxruntime"})
    assert "s3" not in render_runtime_config(pools_of(isvc)[0])
    assert not any(e["name"].startswith("AWS_") for e in _runtime_container(isvc)["env"])


@pytest.mark.parametrize(
    ("storage", "field"),
    [
        ({"s3": {"endpoint": "minio:9000"}}, "endpoint"),
        ({"s3": {"endpoint": "http://minio:9000/bucket"}}, "endpoint"),
        ({"s3": {"credentialsSecret": "Not_A_Name"}}, "credentialsSecret"),
        ({"s3": {"region": ""}}, "region"),
        ({"s3": {"accessKey": "AKIA..."}}, "accessKey"),
    ],
)
def test_invalid_s3_settings_are_refused_naming_the_field(storage, field) -> None:
    with pytest.raises(ValueError, match=field):
        _isvc(runtime={"backend": "onnxruntime", "storage": storage})


# -- batching.timeoutMs reaches the runtime ---------------------------------------------------


def test_batching_timeout_is_rendered_into_the_runtime_config() -> None:
    model = {
        "name": "m",
        "engines": [{"uri": "file:///models/m.onnx"}],
        "batching": {"maxQueueDelayMs": 3, "timeoutMs": 250},
    }
    rendered = render_runtime_config(pools_of(_isvc(models=[model]))[0])
    assert rendered["models"][0]["batching"]["timeoutMs"] == 250
    config = RuntimeConfig.model_validate(rendered)
    assert config.models[0].batching.timeout_ms == 250
    assert config.models[0].batching.max_queue_delay_ms == 3


def test_unset_batching_timeout_leaves_the_config_and_its_hash_as_before() -> None:
    rendered = render_runtime_config(pools_of(_isvc())[0])
    assert "timeoutMs" not in rendered["models"][0]["batching"]
    assert RuntimeConfig.model_validate(rendered).models[0].batching.timeout_ms is None


# -- Degraded: the spec passes the schema but cannot work --------------------------------------


@pytest.mark.parametrize(
    ("path", "header", "manifest"), degraded_cases(), ids=lambda v: getattr(v, "stem", "")
)
def test_degraded_manifest_names_the_field_to_change(
    path: Any, header: dict[str, str], manifest: dict[str, Any]
) -> None:
    problems = find_spec_problems(api.parse_inference_service(manifest))
    assert len(problems) == 1, problems
    assert header["field"] in problems[0], problems
    assert header["expect"] in problems[0], problems


def test_degraded_corpus_is_not_empty() -> None:
    assert len(degraded_cases()) >= 10


@pytest.mark.parametrize(
    "path", [*example_paths(), *accepted_paths()], ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_examples_and_edge_values_hold_no_ineffective_setting(path: Any) -> None:
    """The warnings must not over-reach: every shipped example and every edge value next to
    a rule is silent."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == api.KIND]
    assert docs, path
    for doc in docs:
        isvc = api.parse_inference_service(doc)
        assert find_spec_warnings(isvc) == [], (path.name, find_spec_warnings(isvc))


@pytest.mark.parametrize(
    ("autoscaling", "warned"),
    [
        # The activator fronts it: after a wake a surge reaches the pool and promotes the
        # standby (issue 31: the old "nothing promotes the standby" was a false alarm).
        ({"minReplicas": 0, "standbyReplicas": 1}, False),
        ({"minReplicas": 0, "maxReplicas": 1, "standbyReplicas": 1}, True),
        ({"minReplicas": 0, "standbyReplicas": 0}, False),  # scale to zero itself is fine
        ({"minReplicas": 1, "maxReplicas": 2, "standbyReplicas": 1}, False),  # exactly fits
        ({"minReplicas": 2, "maxReplicas": 2, "standbyReplicas": 1}, True),
        ({"standbyReplicas": 1, "maxStandbyReplicas": 3}, False),
        ({"standbyReplicas": 0, "maxStandbyReplicas": 0}, False),  # no standby at all
        ({"standbyReplicas": 3, "maxStandbyReplicas": 3}, True),
    ],
)
def test_standby_warnings_fire_only_where_the_setting_cannot_act(
    autoscaling: dict[str, int], warned: bool
) -> None:
    warnings = find_spec_warnings(_isvc(autoscaling=autoscaling))
    assert bool(warnings) is warned, warnings


@pytest.mark.parametrize(
    ("spec", "warned"),
    [
        ({"autoscaling": {"minReplicas": 0, "holdTimeoutSeconds": 30}}, False),  # the activator
        ({"autoscaling": {"minReplicas": 0}}, False),
        ({"autoscaling": {"minReplicas": 1}}, False),
        ({"autoscaling": {"minReplicas": 1, "holdTimeoutSeconds": 30}}, True),
        # Manual replicas never reach zero, whatever minReplicas says.
        ({"replicas": 2, "autoscaling": {"minReplicas": 0, "holdTimeoutSeconds": 30}}, True),
        # A fleet's gateway holds for spec.fleet.gateway.holdTimeoutSeconds.
        (
            {
                "fleet": {},
                "memory": {"engineCacheBudget": "1Gi"},
                "autoscaling": {"minReplicas": 0, "holdTimeoutSeconds": 30},
            },
            True,
        ),
    ],
)
def test_hold_timeout_warns_only_where_no_activator_would_use_it(
    spec: dict[str, Any], warned: bool
) -> None:
    warnings = find_spec_warnings(_isvc(**spec))
    assert bool(warnings) is warned, warnings
    assert all("spec.autoscaling.holdTimeoutSeconds" in w for w in warnings), warnings


def test_baseline_problem_names_the_primary_field_the_baseline_copies() -> None:
    isvc = _isvc(
        memory={"weightStreamingBudget": "auto"},
        rollout={"baseline": {"runtime": {"backend": "onnxruntime"}}},
    )
    problems = find_spec_problems(isvc)
    # Both pools read spec.memory (the baseline sets none of its own): both name it.
    assert len(problems) == 2
    assert all("spec.memory.weightStreamingBudget" in p for p in problems)
    assert all("spec.rollout.baseline.memory" not in p for p in problems)
    assert "spec.rollout.baseline.runtime.backend" in problems[1]


def test_model_larger_than_the_budget_names_the_reserve_only_when_set() -> None:
    model = {"name": "m", "engines": [{"uri": "file:///models/m.onnx"}], "memory": "2Gi"}
    without = find_spec_problems(
        _isvc(fleet={}, memory={"engineCacheBudget": "1Gi"}, models=[model])
    )
    with_reserve = find_spec_problems(
        _isvc(fleet={}, memory={"engineCacheBudget": "3Gi", "reserve": "2Gi"}, models=[model])
    )
    assert "spec.memory.reserve" not in without[0]
    assert "spec.memory.engineCacheBudget" in without[0]
    assert "lower spec.memory.reserve" in with_reserve[0]


def test_reserved_env_names_are_the_variables_the_operator_sets() -> None:
    (deployment,) = [o for o in desired_objects(_isvc(), Observed()) if o["kind"] == "Deployment"]
    names = {e["name"] for e in _container(deployment)["env"]}
    assert names == set(api.RESERVED_ENV_NAMES)


def test_a_runtime_config_too_large_for_its_environment_variable_is_a_problem() -> None:
    def models(count: int) -> list[dict[str, Any]]:
        uri = "https://store.example/" + "x" * 400 + ".onnx?sig="
        engine = {"backend": "onnxruntime"}
        return [
            {"name": f"m{i}", "engines": [{**engine, "uri": f"{uri}{i}"}]} for i in range(count)
        ]

    assert find_spec_problems(_isvc(models=models(100))) == []
    (problem,) = find_spec_problems(_isvc(models=models(400)))
    assert "spec.models" in problem and "TIDAL_RUNTIME_CONFIG_JSON" in problem
    assert str(MAX_ENV_STRING_BYTES) in problem


# -- spec.rollout.baseline.runtime: field-by-field override of the primary's runtime ------------

_PRIMARY_RUNTIME = {
    "image": "my/runtime:v0",
    "backend": "onnxruntime",
    "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
    "env": [{"name": "OMP_NUM_THREADS", "value": "2"}],
    "logLevel": "debug",
}
_BOTH_ENGINES = [
    {
        "name": "m",
        "engines": [
            {"uri": "file:///models/m.onnx"},
            {"uri": "file:///models/sm90-trt10.8-fp16.engine"},
        ],
    }
]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        # image only: the rest stays the primary's (no backend: tensorrt filled in).
        ({"image": "my/runtime:v1"}, {**_PRIMARY_RUNTIME, "image": "my/runtime:v1"}),
        (
            {"backend": "tensorrt", "gpus": 2},
            {**_PRIMARY_RUNTIME, "backend": "tensorrt", "gpus": 2},
        ),
        # a nested object is replaced whole: the primary's requests do not survive.
        (
            {"resources": {"limits": {"memory": "16Gi"}}},
            {**_PRIMARY_RUNTIME, "resources": {"limits": {"memory": "16Gi"}}},
        ),
        ({"env": []}, {k: v for k, v in _PRIMARY_RUNTIME.items() if k != "env"}),
        ({}, _PRIMARY_RUNTIME),
    ],
)
def test_baseline_runtime_replaces_only_the_fields_it_names(
    override: dict[str, Any], expected: dict[str, Any]
) -> None:
    isvc = _isvc(
        runtime=_PRIMARY_RUNTIME, models=_BOTH_ENGINES, rollout={"baseline": {"runtime": override}}
    )
    assert find_spec_problems(isvc) == []
    primary, baseline = pools_of(isvc)
    assert primary.runtime.to_wire() == api.Runtime.model_validate(_PRIMARY_RUNTIME).to_wire()
    assert baseline.runtime.to_wire() == api.Runtime.model_validate(expected).to_wire(), (
        override,
        baseline.runtime.to_wire(),
    )


def test_baseline_runtime_override_on_the_wire_keeps_only_what_was_written() -> None:
    isvc = _isvc(rollout={"baseline": {"runtime": {"image": "my/runtime:v1"}}})
    baseline = isvc.spec.rollout.baseline
    assert baseline is not None and baseline.runtime is not None
    assert baseline.runtime.to_wire() == {"image": "my/runtime:v1"}
    assert pools_of(isvc)[1].runtime.backend is api.Backend.ONNXRUNTIME


@pytest.mark.parametrize(
    ("primary", "override", "fields"),
    [
        # gpus named alone, against the primary's onnxruntime backend.
        ({"backend": "onnxruntime"}, {"gpus": 2}, ["spec.rollout.baseline.runtime.gpus"]),
        # backend named alone, against the primary's explicit gpus.
        (
            {"backend": "tensorrt", "gpus": 1},
            {"backend": "onnxruntime", "image": "my/runtime:v1"},
            ["spec.rollout.baseline.runtime.backend", "spec.rollout.baseline.runtime.image"],
        ),
        ({"backend": "tensorrt"}, {"gpus": 0}, ["spec.rollout.baseline.runtime.gpus"]),
    ],
)
def test_baseline_runtime_that_merges_into_an_invalid_runtime_is_a_spec_problem(
    primary: dict[str, Any], override: dict[str, Any], fields: list[str]
) -> None:
    isvc = _isvc(runtime=primary, models=_BOTH_ENGINES, rollout={"baseline": {"runtime": override}})
    problems = find_spec_problems(isvc)
    assert len(problems) == 1, problems
    assert problems[0].startswith("baseline pool: "), problems
    assert all(f in problems[0] for f in fields), problems
    assert "runtime.gpus must" in problems[0], problems
    # The pools stay known (status, names) though nothing is built for them.
    assert [p.name for p in pools_of(isvc)] == [PRIMARY, BASELINE]


def test_baseline_problem_names_the_primary_runtime_field_it_copies() -> None:
    isvc = _isvc(
        memory={"weightStreamingBudget": "auto"},
        rollout={"baseline": {"runtime": {"image": "my/runtime:v1"}}},
    )
    problems = find_spec_problems(isvc)
    assert len(problems) == 2, problems
    assert "spec.runtime.backend" in problems[1], problems
    assert "spec.rollout.baseline.runtime" not in problems[1], problems


def test_runtime_override_has_runtime_fields_without_defaults() -> None:
    assert set(api.RuntimeOverride.model_fields) == set(api.Runtime.model_fields)
    assert api.RuntimeOverride().to_wire() == {}
    with pytest.raises(ValidationError, match="at least 1 character"):
        api.RuntimeOverride.model_validate({"image": ""})
    with pytest.raises(ValidationError, match="names must be unique"):
        api.RuntimeOverride.model_validate({"env": [{"name": "A"}, {"name": "A"}]})


# -- failures the API server reports about a pool, named by the spec field ----------------------

POD_SECURITY = (
    'pods "svc-{pool}-6c9f7b-x2k4q" is forbidden: violates PodSecurity "baseline:latest": '
    'hostPath volumes (volume "engine-cache")'
)


@pytest.mark.parametrize(
    ("spec", "pool", "field"),
    [
        (
            {"runtime": {"backend": "onnxruntime", "engineCache": {"hostPath": "/c"}}},
            "primary",
            "spec.runtime.engineCache.hostPath /c",
        ),
        # The baseline's own engineCache, or the primary's it copies.
        (
            {
                "runtime": {"backend": "onnxruntime"},
                "rollout": {"baseline": {"runtime": {"engineCache": {"hostPath": "/b"}}}},
            },
            "baseline",
            "spec.rollout.baseline.runtime.engineCache.hostPath /b",
        ),
        (
            {
                "runtime": {"backend": "onnxruntime", "engineCache": {"hostPath": "/c"}},
                "rollout": {"baseline": {}},
            },
            "baseline",
            "spec.runtime.engineCache.hostPath /c",
        ),
    ],
)
def test_a_pod_security_refusal_of_the_cache_names_the_field(
    spec: dict[str, Any], pool: str, field: str
) -> None:
    message = POD_SECURITY.format(pool=pool)
    explained = explain_pool_failure(_isvc(**spec), message)
    assert explained.startswith(f"{field}: the namespace ns's Pod Security level forbids")
    assert f"pool {pool}" in explained and message in explained


def test_other_pool_failures_are_left_as_the_api_server_words_them() -> None:
    isvc = _isvc(runtime={"backend": "onnxruntime", "engineCache": {"hostPath": "/c"}})
    for message in (
        'pods "x" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=1',
        'violates PodSecurity "restricted:latest": runAsNonRoot != true (pod)',
        "ProgressDeadlineExceeded",
    ):
        assert explain_pool_failure(isvc, message) == message
