"""Request bodies are bounded: 413 before a longer one is read, let alone parsed.

Pure ASGI middleware. A declared ``Content-Length`` over the limit is answered at
once without reading a byte of the body; otherwise (chunked bodies included) the
bytes are counted as they arrive and the first message past the limit raises a 413
through the app's error handlers (``{"error": "too_large", ...}``). Starlette's own
``max_body_size`` answers a declared-too-long body in plain text, hence this.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from amptrain.server.web.errors import error_response


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimit:
    """Refuse HTTP request bodies longer than ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            response = error_response(413, "too_large", BodyTooLarge(self.max_bytes).detail)
            response.headers["Connection"] = "close"  # the unread body must not be parsed
            await response(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)
