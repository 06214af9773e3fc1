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


def test_leader_election_is_off_by_default_and_named_after_the_scope() -> None:
    import pytest

    from tidal.operator.__main__ import lease_name

    args = parse_args([], {})
    assert not args.leader_elect
    assert (args.lease_name, args.lease_namespace, args.lease_seconds) == (
        "tidal-operator",
        "default",
        15,
    )
    shard = parse_args(["--leader-elect", "-n", "b", "-n", "a"], {"POD_NAMESPACE": "tidal-system"})
    assert shard.leader_elect and shard.lease_namespace == "tidal-system"
    # The same namespaces, in any order, elect through the same Lease; another set, another.
    assert shard.lease_name == lease_name(["a", "b"]) == lease_name([" b", "a"])
    assert shard.lease_name != lease_name(["a"]) and shard.lease_name.startswith("tidal-operator-")
    env = parse_args([], {"TIDAL_OPERATOR_LEADER_ELECT": "true", "TIDAL_OPERATOR_NAMESPACES": "x"})
    assert env.leader_elect and env.lease_namespace == "x"
    assert not parse_args(["--no-leader-elect"], {"TIDAL_OPERATOR_LEADER_ELECT": "1"}).leader_elect
    with pytest.raises(SystemExit):
        parse_args(["--lease-seconds", "2"], {})
    with pytest.raises(SystemExit):
        parse_args(["--resync-seconds", "0"], {})


def test_lease_timings_follow_client_go_proportions_and_are_checked() -> None:
    import pytest

    from tidal.operator.shell.leader import LeaseSettings

    s = LeaseSettings.for_lease("l", "ns", 15)
    assert (s.lease_seconds, s.renew_seconds, s.retry_seconds) == (15, 10, 2)
    short = LeaseSettings.for_lease("l", "ns", 6)
    assert short.lease_seconds > short.renew_seconds > 1.2 * short.retry_seconds >= 1.2
    with pytest.raises(ValueError, match="lease_seconds must be greater"):
        LeaseSettings("l", "ns", lease_seconds=5, renew_seconds=5, retry_seconds=1)
    assert LeaseSettings("l", "ns").identity != LeaseSettings("l", "ns").identity
