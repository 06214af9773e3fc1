"""tidal.common.settings: a process's flags from the command line and the environment, and its
configuration's sources, read one way for the runtime and the gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.common.settings import ConfigError, read_config_data, read_settings
from tidal.gateway.config import GatewaySettings
from tidal.runtime.config import RuntimeSettings


def test_a_flag_wins_over_its_variable_and_an_empty_variable_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDAL_PORT", "9000")
    monkeypatch.setenv("TIDAL_GRPC_PORT", "")
    monkeypatch.setenv("TIDAL_LOG_LEVEL", "DEBUG")
    settings = read_settings(RuntimeSettings, ["--port", "9100"], "tidal-runtime")
    got = (settings.port, settings.grpc_port, settings.log_level)
    assert got == (9100, None, "DEBUG"), settings
    assert read_settings(RuntimeSettings, [], "tidal-runtime").port == 9000


def test_command_line_only_fields_ignore_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_CONFIG", "/elsewhere.yaml")
    monkeypatch.setenv("TIDAL_CHECK_CONFIG", "true")
    monkeypatch.setenv("TIDAL_REPLICA", '["http://a:1"]')
    settings = read_settings(GatewaySettings, ["--replica", "http://b:2"], "tidal-gateway")
    assert (settings.config, settings.check_config, settings.replica) == (
        None,
        False,
        ["http://b:2"],
    ), settings
    assert "TIDAL_CONFIG" not in GatewaySettings.environment_names()


def test_an_invalid_value_names_its_flag_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDAL_EVENT_LOOP", "trio")
    with pytest.raises(ConfigError) as error:
        read_settings(GatewaySettings, [], "tidal-gateway")
    assert "--event-loop / TIDAL_EVENT_LOOP" in str(error.value), error.value


def test_configuration_sources_file_then_path_variable_then_inline_json(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("source: flag\n")
    (tmp_path / "b.json").write_text('{"source": "path variable"}')
    env = {"PATH_VAR": str(tmp_path / "b.json"), "JSON_VAR": '{"source": "inline"}'}

    def source(path: str | None, env: dict[str, str]) -> object:
        data = read_config_data(
            path, env, json_variable="JSON_VAR", path_variable="PATH_VAR", what="test"
        )
        return data.get("source")

    assert source(str(tmp_path / "a.yaml"), env) == "flag"
    assert source(None, env) == "path variable"
    assert source(None, {"JSON_VAR": env["JSON_VAR"]}) == "inline"
    assert source(None, {}) is None
    with pytest.raises(ConfigError, match="JSON_VAR is not valid JSON"):
        source(None, {"JSON_VAR": "{"})
