"""A Content-Security-Policy for the API's own documentation pages, ``/docs`` (Swagger UI),
``/redoc`` and Swagger's OAuth2 redirect page.

Their scripts and styles come from the fastapi-offline package under ``/docs/assets``, so
the policy allows only the service's own origin. The pages' inline ``<script>`` blocks
(Swagger UI's start-up call, the redirect page's handler) are allowed by their SHA-256
hash, computed from the page as served, so no other inline script runs. Styles allow
``'unsafe-inline'``: both bundles set styles at run time (ReDoc injects ``<style>``
elements), which no hash can name. ReDoc's search runs in a web worker it starts from a
``blob:`` URL, so ``worker-src`` allows ``blob:`` on these pages only.

Pure ASGI middleware: for those paths it holds the response (a few kilobytes of HTML)
until the body is complete, then adds the header.
"""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGES = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})
_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)
_POLICY = (
    "default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def policy_for(html: bytes) -> str:
    """The policy for one documentation page: its own inline scripts by hash."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'"
        for body in _INLINE_SCRIPT.findall(html)
    )
    return _POLICY.format(hashes=hashes)


class DocsPolicy:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PAGES:
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def with_policy(message: Message) -> None:
            if message["type"] not in ("http.response.start", "http.response.body"):
                await send(message)
                return
            held.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                body = b"".join(m.get("body", b"") for m in held[1:])
                MutableHeaders(scope=held[0])["Content-Security-Policy"] = policy_for(body)
                for m in held:
                    await send(m)

        await self.app(scope, receive, with_policy)
