"""Pure parts of the node agent: $(VAR) expansion, downward-API fields, addresses, probes,
termination messages."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from tidal.sandbox.nodeagent import (
    ProbeState,
    UnsupportedPod,
    expand,
    field_ref,
    run_probe,
    termination_message,
)

POD = {
    "metadata": {
        "name": "web-1",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "web"},
        "annotations": {"a/b": "c"},
    },
    "spec": {"nodeName": "tidal-node-1", "serviceAccountName": "default"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-2"),
        ("$$(A)", "$(A)"),
        ("$(MISSING)", "$(MISSING)"),
        ("plain", "plain"),
        ("$(A)$(A)", "11"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "web-1"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("spec.nodeName", "tidal-node-1"),
        ("status.podIP", "127.1.0.9"),
        ("status.hostIP", "127.0.0.1"),
        ("metadata.labels['app']", "web"),
        ("metadata.annotations['a/b']", "c"),
    ],
)
def test_field_ref_resolves_downward_api(path: str, expected: str) -> None:
    assert field_ref(POD, path, "127.1.0.9") == expected


def test_field_ref_rejects_unknown_paths_with_a_reason() -> None:
    with pytest.raises(UnsupportedPod) as err:
        field_ref(POD, "status.phase", "127.1.0.9")
    assert err.value.reason == "FieldRefUnsupported"


def test_probe_state_needs_thresholds() -> None:
    p = ProbeState({"successThreshold": 2, "failureThreshold": 2}, next_at=0)
    p.record(True)
    assert p.result is None
    p.record(True)
    assert p.result is True
    p.record(False)
    assert p.result is True
    p.record(False)
    assert p.result is False


def test_http_and_tcp_probes_against_a_real_server(tmp_path: Path) -> None:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 500)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    try:
        ip = "127.0.0.1"
        assert run_probe({"httpGet": {"path": "/ok", "port": port}}, ip, {}, {}, tmp_path)
        assert not run_probe({"httpGet": {"path": "/bad", "port": port}}, ip, {}, {}, tmp_path)
        assert run_probe(
            {"httpGet": {"path": "/ok", "port": "web"}}, ip, {"web": port}, {}, tmp_path
        )
        assert run_probe({"tcpSocket": {"port": port}}, ip, {}, {}, tmp_path)
        assert run_probe({"exec": {"command": ["true"]}}, ip, {}, {}, tmp_path)
        assert not run_probe({"exec": {"command": ["false"]}}, ip, {}, {}, tmp_path)
    finally:
        srv.shutdown()
        srv.server_close()
    assert not run_probe({"tcpSocket": {"port": port}}, ip, {}, {}, tmp_path)


def test_pod_network_gives_each_pod_a_reachable_address_of_its_own() -> None:
    import socket
    import subprocess

    from tidal.sandbox.podnet import PodNetwork, enter

    net = PodNetwork()
    net.setup()
    server: subprocess.Popen[bytes] | None = None
    try:
        (ns1, ip1), (ns2, ip2) = net.attach(), net.attach()
        assert ip1 != ip2 and net.subnet is not None
        assert {ip1, ip2} <= {str(h) for h in net.subnet.hosts()}
        server = subprocess.Popen(
            enter(
                ns1,
                [
                    "python3",
                    "-c",
                    "import socket,time;s=socket.socket();"
                    f"s.bind(('{ip1}',8080));s.listen();print('up',flush=True);"
                    "c,_=s.accept();c.sendall(b'hi');time.sleep(0.5)",
                ],
            ),
            stdout=subprocess.PIPE,
        )
        assert server.stdout is not None and server.stdout.readline() == b"up\n"
        with socket.create_connection((ip1, 8080), timeout=5) as conn:
            assert conn.recv(2) == b"hi"
        server.wait(timeout=5)
        net.detach(ns2, ip2)
        assert net.attach()[1] == ip2  # released addresses are reused
    finally:
        if server is not None and server.poll() is None:
            server.kill()  # a failed connection leaves it waiting in accept()
            server.wait(timeout=10)
        net.teardown()
    assert (
        f"tidal{net.index}-"
        not in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_routes_into_a_pod_subnet_go_with_it() -> None:
    """A killed benchmark once left routes into a pod subnet through its own namespace, more
    specific than the bridge's: the next sandbox on that subnet could not reach its pods.
    Taking down a subnet (as every setup does first for a subnet no live owner holds) removes
    every route into it."""
    import subprocess

    from tidal.sandbox.podnet import PodNetwork

    def ip(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)

    net = PodNetwork()
    net.setup()
    assert net.subnet is not None
    half = str(next(net.subnet.subnets(prefixlen_diff=1)))
    link = f"tstale{net.index}"
    try:
        made = ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        assert made.returncode == 0, made.stderr
        ip("link", "set", link, "up")
        added = ip("route", "add", half, "dev", link)
        assert added.returncode == 0, added.stderr
        net.teardown()
        left = ip("route", "show", "root", str(net.subnet)).stdout
        assert not left.strip(), f"routes into {net.subnet} after teardown: {left}"
    finally:
        net.teardown()
        ip("link", "del", link)


def testtermination_message_is_the_file_else_the_logs_tail_of_a_failure(tmp_path: Path) -> None:
    """As kubelet: the file at terminationMessagePath (at most 4096 bytes); empty, with
    FallbackToLogsOnError and a non-zero exit, the log's last 80 lines (at most 2048 bytes)."""
    log = tmp_path / "c.log"
    log.write_text("".join(f"line {i}\n" for i in range(200)))
    report = tmp_path / "report.json"
    spec = {
        "terminationMessagePath": str(report),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    report.write_text("x" * 5000)
    assert termination_message(spec, log, 1) == "x" * 4096
    report.write_text("")
    tail = termination_message(spec, log, 1)
    assert tail.splitlines()[0] == "line 120" and tail.endswith("line 199"), tail[:80]
    assert termination_message(spec, log, 0) == "", "no fallback for a success"
    plain = {"terminationMessagePath": str(report)}
    assert termination_message(plain, log, 1) == "", "no fallback without the policy"
    # the default path is the host's /dev here: never read
    host = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    assert termination_message(host, log, 2).endswith("line 199")
