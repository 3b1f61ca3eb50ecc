"""Headers every HTTP response carries, whatever produced it (routes, error handlers, the
dashboard's files): ``X-Content-Type-Options: nosniff``, so a browser never reads a JSON
answer that quotes user input as a script or a page, and ``X-Frame-Options: DENY`` for
browsers that predate the Content-Security-Policy's ``frame-ancestors 'none'``.

Pure ASGI middleware: it only adds two headers to ``http.response.start``.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADERS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    if name not in headers:
                        headers.append(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)
