"""The load generator's balancing and what it records of an answer (pure: no endpoints are
polled)."""

from __future__ import annotations

from collections import Counter

from tidal.sandbox.loadgen import LoadGenerator, answer_version


def _generator(endpoints: tuple[str, ...]) -> LoadGenerator:
    generator = LoadGenerator(None, "ns", "svc", "m", {}, lambda t: 1.0)
    generator.watcher.current = endpoints
    return generator


def test_ties_are_spread_over_every_endpoint() -> None:
    # A light load has nothing in flight anywhere: every endpoint must still get its share
    # (taking the first of the ties sent all of it to the EndpointSlice's first address).
    generator = _generator(("a:1", "b:1", "c:1"))
    picks = Counter(generator._pick() for _ in range(3000))
    assert set(picks) == {"a:1", "b:1", "c:1"}
    assert min(picks.values()) > 800, picks


def test_least_outstanding_wins_and_exclude_is_honoured() -> None:
    generator = _generator(("a:1", "b:1", "c:1"))
    generator._in_flight.update({"a:1": 2, "b:1": 0, "c:1": 1})
    assert {generator._pick() for _ in range(50)} == {"b:1"}
    assert {generator._pick(exclude="b:1") for _ in range(50)} == {"c:1"}
    assert _generator(())._pick() is None


def test_each_answer_records_the_model_version_that_served_it() -> None:
    answer = b'{"model_name":"digits","model_version":"3","outputs":[]}'
    assert answer_version(answer) == "3"
    for body in (b"", b"not json", b"[1, 2]", b'{"outputs": []}', b'{"error": "x"}'):
        assert answer_version(body) == "", body
