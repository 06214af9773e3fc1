"""tidal-operator's settings: flags win over environment, environment over defaults."""

from __future__ import annotations

from tidal.operator.__main__ import parse_args


def test_defaults_are_cluster_wide() -> None:
    args = parse_args([], {})
    assert args.namespaces == []
    assert (args.workers, args.metrics_port, args.health_port) == (4, 8081, 8082)
    assert args.log_format == "json"


def test_environment_sets_namespaces_and_numbers() -> None:
    env = {
        "TIDAL_OPERATOR_NAMESPACES": "a, b",
        "TIDAL_OPERATOR_WORKERS": "8",
        "TIDAL_OPERATOR_LOG_LEVEL": "debug",
    }
    args = parse_args([], env)
    assert [n.strip() for n in args.namespaces] == ["a", "b"]
    assert args.workers == 8
    assert args.debug


def test_flags_win_over_environment() -> None:
    env = {"TIDAL_OPERATOR_NAMESPACES": "a", "TIDAL_OPERATOR_WORKERS": "8"}
    args = parse_args(["--namespace", "x", "-n", "y", "--workers", "2"], env)
    assert args.namespaces == ["x", "y"]
    assert args.workers == 2
