"""The setting rules of ``core.rules``: one table, one manifest (or more) per rule, and the
README's table generated from it.

Each ``invalid/ineffective/*.yaml`` names its rule (``rule:``), the reason the user sees
(``reason:``), the field and words of the message: the manifest must build, and fire that rule
and no other. Removing a rule from the table leaves its manifests silent, so each fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from isvc_fixtures import REPO, ineffective_cases, minimal

from tidal.operator import crdgen
from tidal.operator.core import api
from tidal.operator.core.resources import Observed, desired_objects, find_spec_problems
from tidal.operator.core.rules import (
    FAULT_TRANSFER_ENV,
    SETTING_RULES,
    Outcome,
    find_setting_findings,
)


def _isvc(**spec: Any) -> api.InferenceService:
    return api.parse_inference_service(minimal(**spec))


@pytest.mark.parametrize(
    ("path", "header", "manifest"), ineffective_cases(), ids=lambda v: getattr(v, "stem", "")
)
def test_each_manifest_fires_its_rule_alone_naming_the_field(
    path: Path, header: dict[str, str], manifest: dict[str, Any]
) -> None:
    isvc = api.parse_inference_service(manifest)
    assert find_spec_problems(isvc) == [], path.name  # nothing blocks the children
    findings = find_setting_findings(isvc)
    assert [f.rule for f in findings] == [header["rule"]], (path.name, findings)
    (finding,) = findings
    assert finding.outcome is Outcome(header["reason"]), (path.name, finding)
    assert header["field"] in finding.message, finding.message
    assert header["expect"] in finding.message, finding.message
    assert desired_objects(isvc, Observed()), path.name  # the service is built and serves


def test_every_rule_has_a_manifest_and_every_manifest_a_rule() -> None:
    named = {header["rule"] for _path, header, _manifest in ineffective_cases()}
    ids = [rule.id for rule in SETTING_RULES]
    assert len(ids) == len(set(ids))
    assert named == set(ids)


@pytest.mark.parametrize(
    "spec",
    [
        # A standby with minReplicas 0: the activator fronts the service, a surge after a
        # wake reaches the pool and promotes it (issue 31's false alarm).
        {"autoscaling": {"minReplicas": 0, "standbyReplicas": 2}},
        {"autoscaling": {"minReplicas": 0, "maxReplicas": 3, "standbyReplicas": 2}},
        # The default scaleToZeroAfterSeconds cannot be told from one written.
        {"autoscaling": {"minReplicas": 1, "scaleToZeroAfterSeconds": 300}},
        {"autoscaling": {"minReplicas": 0, "scaleToZeroAfterSeconds": 0}},
        # A hold as long as the cold start the SLO accepts.
        {
            "autoscaling": {"minReplicas": 0, "holdTimeoutSeconds": 30},
            "rollout": {"slo": {"coldStartMs": 30000}, "onBreach": "alert"},
        },
        {"rollout": {"slo": {"coldStartMs": 300000}, "onBreach": "alert"}},  # no gateway holds
        {
            "fleet": {"gateway": {"holdTimeoutSeconds": 8}},
            "memory": {"engineCacheBudget": "1Gi"},
            "rollout": {"slo": {"coldStartMs": 8000}, "onBreach": "alert"},
        },
        # A disabled forecast with its defaults; an enabled one with its own.
        {"fleet": {"forecast": {"enabled": False}}, "memory": {"engineCacheBudget": "1Gi"}},
        {"fleet": {"forecast": {"leadSeconds": 60}}, "memory": {"engineCacheBudget": "1Gi"}},
        # Transfer waits emulated by the runtime's fault injection are measured.
        {
            "runtime": {
                "backend": "onnxruntime",
                "env": [{"name": FAULT_TRANSFER_ENV, "value": "2"}],
            },
            "rollout": {"slo": {"transferWaitMs": 500}, "onBreach": "alert"},
        },
        # GPU memory with a GPU backend (no InferenceService backend records transfer waits:
        # issue 41 found the old advice, "use it with backend tensorrt", wrong).
        {
            "runtime": {"backend": "tensorrt"},
            "models": [{"name": "m", "engines": [{"uri": "file:///m/sm90-trt10.0-fp16.engine"}]}],
            "rollout": {"slo": {"gpuMemoryHeadroom": "10%"}, "onBreach": "alert"},
        },
        # A hold as long as the fastest wake; forecast slots as long as the interval; an
        # engine cache for engines that are downloaded.
        {"autoscaling": {"minReplicas": 0, "holdTimeoutSeconds": 2}},
        {
            "fleet": {
                "placement": {"intervalSeconds": 10},
                "forecast": {"period": "10m", "slots": 60},
            },
            "memory": {"engineCacheBudget": "1Gi"},
        },
        {
            "runtime": {"backend": "onnxruntime", "engineCache": {"hostPath": "/var/cache/t"}},
            "models": [{"name": "m", "engines": [{"uri": "http://models.example/m.onnx"}]}],
        },
        # A weight streaming budget below the engine budget, or a share of the weights.
        {
            "runtime": {"backend": "tensorrt"},
            "models": [{"name": "m", "engines": [{"uri": "file:///m/sm90-trt10.0-fp16.engine"}]}],
            "memory": {
                "engineCacheBudget": "8Gi",
                "reserve": "1Gi",
                "weightStreamingBudget": "6Gi",
            },
        },
        {
            "runtime": {"backend": "tensorrt"},
            "models": [{"name": "m", "engines": [{"uri": "file:///m/sm90-trt10.0-fp16.engine"}]}],
            "memory": {"engineCacheBudget": "1Gi", "weightStreamingBudget": "100%"},
        },
        # An engine budget that fits the container's memory, or a GPU budget.
        {
            "runtime": {"backend": "onnxruntime", "resources": {"limits": {"memory": "2Gi"}}},
            "memory": {"engineCacheBudget": "2Gi"},
        },
        {
            "runtime": {"backend": "onnxruntime", "resources": {"limits": {"memory": "1Gi"}}},
            "memory": {"engineCacheBudget": "2Gi", "reserve": "1Gi"},
        },
    ],
)
def test_edges_next_to_each_rule_are_silent(spec: dict[str, Any]) -> None:
    assert find_setting_findings(_isvc(**spec)) == []


def test_activator_hold_conflict_names_the_default_when_unset() -> None:
    isvc = _isvc(
        autoscaling={"minReplicas": 0},
        rollout={"slo": {"coldStartMs": 121000}, "onBreach": "alert"},
    )
    (finding,) = find_setting_findings(isvc)
    assert finding.outcome is Outcome.CONFLICTING
    assert "spec.autoscaling.holdTimeoutSeconds 120 is shorter" in finding.message


def test_baseline_engine_budget_conflict_names_the_baseline_fields() -> None:
    isvc = _isvc(
        runtime={"backend": "onnxruntime"},
        rollout={
            "baseline": {
                "runtime": {"resources": {"limits": {"memory": "1Gi"}}},
                "memory": {"engineCacheBudget": "4Gi"},
            }
        },
    )
    (finding,) = find_setting_findings(isvc)
    assert finding.rule == "engine-cache-budget-above-memory-limit"
    assert "spec.rollout.baseline.memory.engineCacheBudget" in finding.message
    assert "spec.rollout.baseline.runtime.resources.limits.memory" in finding.message


def test_readme_rules_table_is_generated_from_the_rules() -> None:
    readme = (REPO / "operator" / "README.md").read_text()
    assert crdgen.with_rules_table(readme) == readme, (
        "operator/README.md's rules table is out of date: run make crds"
    )
    table = crdgen.rules_table()
    for rule in SETTING_RULES:
        assert f"(`{rule.id}`)" in table
    for _field, message in crdgen.admission_rules():
        assert message.replace("|", "\\|") in table


def test_admission_rules_cover_the_engine_cache_refusals() -> None:
    fields = dict((message, field) for field, message in crdgen.admission_rules())
    assert fields[api.HOST_PATH_BACKSTEP_MESSAGE] == "spec.runtime.engineCache.hostPath"
    assert fields[api.SIZE_LIMIT_WITH_HOST_PATH_MESSAGE] == "spec.runtime.engineCache.sizeLimit"


def test_crdgen_check_fails_on_a_stale_rules_table(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{crdgen.RULES_BEGIN}\nold\n{crdgen.RULES_END}\nrest\n")
    args = ["--readme", str(readme), str(tmp_path)]
    assert crdgen.main(["--check", *args]) == 1
    assert crdgen.main(args) == 0
    assert crdgen.main(["--check", *args]) == 0
    assert readme.read_text().startswith("intro\n") and readme.read_text().endswith("rest\n")
