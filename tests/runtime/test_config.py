"""Configuration: parsing, sources, error messages naming the field, exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidal.common.settings import ConfigError
from tidal.runtime.config import RuntimeConfig, load_config, parse_config

ENGINE = {"uri": "file:///m/model.onnx"}


def test_defaults_and_camel_case_round_trip() -> None:
    config = parse_config(
        {
            "models": [
                {
                    "name": "m",
                    "engines": [ENGINE],
                    "maxBatchSize": 16,
                    "batching": {"maxQueueDelayMs": 5, "preferredBatchSizes": [8, 16]},
                }
            ],
            "memory": {"engineCacheBudgetBytes": "2Gi", "weightStreamingBudget": "60%"},
        }
    )
    assert config.memory.engine_cache_budget_bytes == 2 * 2**30
    assert config.models[0].batching.preferred_batch_sizes == [8, 16]
    dumped = config.model_dump(by_alias=True, mode="json")
    assert dumped["models"][0]["maxBatchSize"] == 16
    assert RuntimeConfig.model_validate(dumped) == config


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"backend": "tensorflow"}, "backend"),
        (
            {"models": [{"name": "m", "engines": [ENGINE], "maxBatchSize": 0}]},
            "models.0.maxBatchSize",
        ),
        ({"models": [{"name": "m", "engines": []}]}, "models.0.engines"),
        (
            {"models": [{"name": "m", "engines": [{"uri": "file:///m/x.bin"}]}]},
            "models.0.engines.0",
        ),
        (
            {
                "models": [
                    {
                        "name": "m",
                        "engines": [ENGINE],
                        "maxBatchSize": 4,
                        "batching": {"preferredBatchSizes": [8]},
                    }
                ]
            },
            "preferredBatchSizes",
        ),
        ({"memory": {"engineCacheBudgetBytes": "lots"}}, "memory.engineCacheBudgetBytes"),
        ({"memory": {"evictionPolicy": "random"}}, "memory.evictionPolicy"),
        ({"faults": {"errorRate": 2}}, "faults.errorRate"),
        ({"maxConcurrentLoads": 1, "surprise": True}, "surprise"),
        (
            {"models": [{"name": "m", "engines": [ENGINE]}, {"name": "m", "engines": [ENGINE]}]},
            "appears twice",
        ),
        (
            {"models": [{"name": "m", "engines": [{"uri": "/m/a.onnx", "sha256": "abc"}]}]},
            "models.0.engines.0.sha256",
        ),
    ],
)
def test_invalid_configuration_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(data)
    assert field in str(error.value)


def test_sources_file_then_env_path_then_inline_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("maxConcurrentLoads: 3\n")
    json_file = tmp_path / "c.json"
    json_file.write_text(json.dumps({"maxConcurrentLoads": 4}))
    inline = json.dumps({"maxConcurrentLoads": 5})
    env = {"TIDAL_RUNTIME_CONFIG": str(json_file), "TIDAL_RUNTIME_CONFIG_JSON": inline}
    assert load_config(str(yaml_file), env).max_concurrent_loads == 3
    assert load_config(None, env).max_concurrent_loads == 4
    assert load_config(None, {"TIDAL_RUNTIME_CONFIG_JSON": inline}).max_concurrent_loads == 5
    assert load_config(None, {}).models == []


def test_fault_variables_override_the_file() -> None:
    env = {
        "TIDAL_RUNTIME_CONFIG_JSON": json.dumps({"faults": {"errorRate": 0.5}}),
        "TIDAL_FAULT_ADDED_LATENCY_MS": "25",
        "TIDAL_FAULT_EXTRA_WARMUP_SECONDS": "1.5",
    }
    faults = load_config(None, env).faults
    assert (faults.error_rate, faults.added_latency_ms, faults.extra_warmup_seconds) == (
        0.5,
        25.0,
        1.5,
    )


def test_unreadable_sources_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"), {})
    with pytest.raises(ConfigError, match="TIDAL_RUNTIME_CONFIG_JSON"):
        load_config(None, {"TIDAL_RUNTIME_CONFIG_JSON": "{not json"})
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(tmp_path / "list.yaml"), {})


def test_the_process_exits_2_at_once_naming_the_field() -> None:
    env = {**os.environ, "TIDAL_RUNTIME_CONFIG_JSON": json.dumps({"maxConcurrentLoads": 0})}
    result = subprocess.run(
        [sys.executable, "-m", "tidal.runtime"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "maxConcurrentLoads" in result.stderr


def test_json_schema_uses_camel_case_names() -> None:
    schema = RuntimeConfig.model_json_schema(by_alias=True)
    assert {"backend", "models", "memory", "maxConcurrentLoads", "faults"} <= set(
        schema["properties"]
    )
