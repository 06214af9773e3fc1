"""A tiny HTTP server for sandbox tests and the foundation demo.

``python -m tidal.sandbox.echo`` listens on ``$POD_IP:$PORT`` (default 8080) and answers
``GET /`` with its pod name, ``/healthz`` with 200 (or 503 when ``ECHO_READY=false``) and
``/metrics`` in Prometheus' text format (a request counter and the ``ECHO_GAUGE`` value).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer


class _Handler(BaseHTTPRequestHandler):
    requests = 0
    lock = threading.Lock()

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            ready = os.environ.get("ECHO_READY", "true") != "false"
            self._send(200 if ready else 503, b"ok" if ready else b"not ready", "text/plain")
            return
        if self.path == "/metrics":
            gauge = float(os.environ.get("ECHO_GAUGE", "42"))
            text = (
                "# TYPE echo_requests_total counter\n"
                f"echo_requests_total {_Handler.requests}\n"
                "# TYPE echo_gauge gauge\n"
                f"echo_gauge {gauge}\n"
            )
            self._send(200, text.encode(), "text/plain; version=0.0.4")
            return
        with _Handler.lock:
            _Handler.requests += 1
        body = {"pod": os.environ.get("POD_NAME", "?"), "ip": os.environ.get("POD_IP", "")}
        self._send(200, json.dumps(body).encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer.server_bind() asks DNS for the host's FQDN; a pod's network namespace has
        # no resolver, so that lookup would hang. The name is only used in CGI environments.
        TCPServer.server_bind(self)
        host, port = self.socket.getsockname()[:2]
        self.server_name, self.server_port = str(host), int(port)


def main() -> int:
    host = os.environ.get("POD_IP", "127.0.0.1")
    port = int(os.environ.get("PORT", "8080"))
    server = _Server((host, port), _Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"echo listening on {host}:{port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
