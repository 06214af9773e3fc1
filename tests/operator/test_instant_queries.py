"""The operator's Prometheus client: one instant query over plain HTTP, errors raised with
Prometheus's own message (a real HTTP server in a thread, no client library)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tidal.operator.shell.signals import InstantQueries, PrometheusQueryError


class FakePrometheus(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict[str, Any]]] = []
    seen: list[tuple[str, str, dict[str, list[str]]]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        self.seen.append((self.command, self.path, form))
        status, body = self.answers.pop(0)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    FakePrometheus.answers, FakePrometheus.seen = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_an_instant_query_posts_the_query_and_returns_the_vector(prometheus: str) -> None:
    vector = [{"metric": {"isvc": "s", "signal": "in_flight"}, "value": [1.5, "3"]}]
    FakePrometheus.answers.append(
        (200, {"status": "success", "data": {"resultType": "vector", "result": vector}})
    )
    got = InstantQueries(prometheus).custom_query("sum(up)", {"time": "1.500"}, timeout=5)
    assert got == vector
    method, path, form = FakePrometheus.seen[0]
    assert (method, path) == ("POST", "/api/v1/query")
    assert form == {"query": ["sum(up)"], "time": ["1.500"]}


def test_an_error_answer_raises_with_prometheus_s_message(prometheus: str) -> None:
    bad = {"status": "error", "errorType": "bad_data", "error": "parse error at char 4"}
    FakePrometheus.answers += [(400, bad), (200, bad)]
    client = InstantQueries(prometheus)
    with pytest.raises(PrometheusQueryError, match=r"HTTP 400 .*parse error at char 4"):
        client.custom_query("sum(", timeout=5)
    with pytest.raises(PrometheusQueryError, match="bad_data: parse error at char 4"):
        client.custom_query("sum(", timeout=5)


def test_an_unreachable_prometheus_fails_at_once_without_retries() -> None:
    client = InstantQueries("http://127.0.0.1:9")
    with pytest.raises(OSError):
        client.custom_query("up", timeout=2)
