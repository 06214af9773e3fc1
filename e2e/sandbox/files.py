"""Engine files for pods on the real node, served from the host over HTTP.

The scenarios write their models (and corrupt them, in the fault scenarios) at paths on the host.
A pod of the node agent reads such a path in place (``file://``); a container on the real node
cannot see the host's files, so the sandbox serves each path the scenarios name at
``http://<node bridge address>:<port>/<token>/<file name>``, read from the host at every request:
what a pod downloads is the file's content at that moment, as with ``file://``. Only registered
paths are served; nothing else of the host is. Python's ``http.server`` (threaded) does it: a
handful of downloads per scenario need nothing more.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path
from typing import Any


class FileServer:
    """Serves registered host files read-only on ``host`` (a free port); ``url(path)`` registers."""

    def __init__(self, host: str) -> None:
        self._files: dict[str, Path] = {}
        self._lock = threading.Lock()
        files, lock = self._files, self._lock
        self.downloads: dict[str, int] = {}
        downloads = self.downloads

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    path = files.get(self.path)
                    if path is not None:
                        downloads[self.path] = downloads.get(self.path, 0) + 1
                try:
                    data = path.read_bytes() if path is not None else None
                except OSError:
                    data = None
                if data is None:
                    self.send_error(404, "not a registered file")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # counted in `downloads`; a line per GET would only fill the test log

        self._server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.host, self.port = host, int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sandbox-files", daemon=True
        )
        self._thread.start()

    def url(self, path: Path | str) -> str:
        """The URL a pod fetches ``path`` from (registered on first use)."""
        path = Path(path).resolve()
        token = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        route = f"/{token}/{path.name}"
        with self._lock:
            self._files[route] = path
        return f"http://{self.host}:{self.port}{route}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
