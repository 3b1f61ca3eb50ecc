"""A real webhook receiver on loopback for the alert tests: a stdlib HTTP server in a
thread that records every request (headers and exact body bytes) and answers as told:
``ok`` (204), a status code, ``redirect`` (302 to another URL) or ``hang`` (holds the
request until the receiver closes)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, port: int = 0, mode: str | int = "ok") -> None:
        self.mode: str | int = mode
        self.requests: list[dict[str, Any]] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                mode = receiver.mode
                if mode == "hang":
                    receiver.released.wait(120)
                    return
                if mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                    self.end_headers()
                    return
                self.send_response(204 if mode == "ok" else int(mode))
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self, path: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(r["body"]) for r in self.requests if path in (None, r["path"])]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def verify(secret: str, request: dict[str, Any], max_age_s: float = 300) -> bool:
    """Check a request's ``X-Amptrain-Signature`` the way a receiver should: the HMAC of
    ``"<t>.<body>"`` with the rule's secret, and a timestamp no older than ``max_age_s``."""
    import time

    header = request["headers"]["X-Amptrain-Signature"]
    parts = dict(p.split("=", 1) for p in header.split(","))
    t = int(parts["t"])
    mac = hmac.new(secret.encode(), f"{t}.".encode() + request["body"], hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest(), parts["v1"]) and abs(time.time() - t) < max_age_s
