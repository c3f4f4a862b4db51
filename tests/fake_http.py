"""A JSON API on a free localhost port that records every request (for tests).

Subclasses describe what they record of a request body (`describe`) and how
they answer (`answer`); this class owns the server, its thread and the
clean shutdown, so every fake endpoint starts and stops the same way.
"""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from typing import Any

import portpicker


class FakeJsonApi:
    """Use as a context manager; `host` is its base URL, `requests` what it received."""

    def __init__(self):
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                record = {
                    "method": self.command,
                    "path": url.path,
                    "query": urllib.parse.parse_qs(url.query),
                    **fake.describe(self.headers, raw),
                }
                fake.requests.append(record)
                code, reply = fake.answer(self.command, url.path, record)
                data = json.dumps(reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

        self.port = portpicker.pick_unused_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def describe(self, headers, raw: bytes) -> dict[str, Any]:
        """What a request's record keeps besides method, path and query (default: its JSON body)."""
        return {"body": json.loads(raw) if raw else None}

    def answer(self, method: str, path: str, record: dict[str, Any]) -> tuple[int, Any]:
        """`(status code, JSON reply)` for one request."""
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
