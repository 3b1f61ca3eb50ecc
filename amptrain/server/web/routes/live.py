"""Live telemetry: ``WS /jobs/{id}/ws?after=CURSOR`` and SSE ``GET /jobs/{id}/stream``.

Both send the messages of :mod:`amptrain.server.live.watch` (``metric``, ``event``, ``end``,
``heartbeat``, ``gap``); see there for the cursor scheme. With ``?batch=true`` the
metric and event messages arrive grouped, one frame per delivery round:
``{"type": "batch", "cursor": C, "items": [MESSAGE, ...]}`` (at most 500 items; ``C`` is
the last item's cursor and resumes after it); ``end``, ``heartbeat`` and ``gap`` still
come on their own. Without it every record is its own message, as before. A job followed
by many batch watchers gets its records in rounds at least N x 100 µs apart (N its batch
watchers, at most 50 ms), so the records of a round share one frame and 1,000 watchers
cost the server about 20 frames each a second however fast the job steps.

WebSocket authentication: an ``Authorization: Bearer TOKEN`` header, or (browsers
cannot set headers) the subprotocol pair ``bearer, TOKEN``, answered with the
subprotocol ``bearer``. Never a token in the query string. A missing or unknown
token, or a job the caller may not see, is refused with close code 1008 before the
handshake completes (the client sees the upgrade answered with HTTP 403). A bad or
missing token counts toward ``AMPTRAIN_AUTH_FAILURE_RATE_LIMIT`` as a request's does (SSE
is a request); from an address over it, the upgrade is answered 429 with ``Retry-After``
and the ``{"error", "detail"}`` body instead, while a valid token still opens.

Close codes: 1000 after ``end``; 1013 (try again later) after ``gap``, i.e. the
client fell a whole queue behind and should reconnect with ``after=`` the gap's
cursor; 1008 refused; 4400 a malformed ``after``; 4401 the token was revoked or
expired (checked before each message); 4429 the user already has
``AMPTRAIN_MAX_LIVE_CONNECTIONS_PER_USER`` watchers open (SSE: a 429). Each close
reason is in the close frame and in one log line. A client that stops reading
entirely is disconnected without a close frame a few seconds after its ``gap``.

SSE (served by Starlette's StreamingResponse, no extra dependency): each message is
``event: TYPE`` + ``data: JSON``; metric, event and batch messages carry ``id: CURSOR``,
so an EventSource resumes with ``Last-Event-ID`` (``after=`` works too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from amptrain.contract.cursor import Cursor, CursorError
from amptrain.server.live.hub import LiveHub
from amptrain.server.live.messages import RECORD_TYPES
from amptrain.server.live.watch import Out, Watch
from amptrain.server.runtime import Services
from amptrain.server.web.auth import Principal, authenticate, bearer_token, refusal
from amptrain.server.web.deps import (
    CurrentUser,
    ServicesDep,
    SessionDep,
    client_address,
    failed_authentication,
    parse_cursor,
    visible_job,
)
from amptrain.server.web.errors import (
    AppError,
    NotFound,
    TooMany,
    error_response,
    error_responses,
)
from amptrain.server.web.live_session import CLOSE_TOKEN, CLOSE_TOO_MANY, LiveSession, closed
from amptrain.server.web.params import AfterCursor
from amptrain.store.jobs import get_job

log = logging.getLogger(__name__)

router = APIRouter(prefix="/jobs", tags=["live"])

GAP_GRACE_S = 3.0
"""How long a client that overflowed gets to read its ``gap`` before it is cut off."""
CLOSE_POLICY = 1008
CLOSE_GAP = 1013
CLOSE_BAD_CURSOR = 4400


def get_hub(app: Any) -> LiveHub:
    hub: LiveHub = app.state.services.hub
    return hub


def open_watch(app: Any, job_id: str, after: Cursor | None) -> Watch:
    """One watcher's message stream (history after ``after``, then live), for WS and SSE alike."""
    services = app.state.services
    return Watch(
        get_hub(app),
        services.session_factory,
        job_id,
        after,
        heartbeat_s=services.settings.live_heartbeat_seconds,
    )


# -- WebSocket --------------------------------------------------------------------------


def ws_credentials(ws: WebSocket) -> tuple[str | None, bool]:
    """(token, answered with subprotocol ``bearer``) from the header or the subprotocols."""
    token = bearer_token(ws.headers.get("authorization"))
    if token:
        return token, "bearer" in ws.scope.get("subprotocols", [])
    protocols = [p.strip() for p in ws.scope.get("subprotocols", [])]
    if "bearer" in protocols:
        i = protocols.index("bearer")
        if i + 1 < len(protocols) and protocols[i + 1]:
            return protocols[i + 1], True
    return None, False


def watcher(
    services: Services, token: str | None, job_id: str, address: str
) -> Principal | AppError:
    """The token's principal if it is valid and may see the job; else what refuses the
    handshake: a failed authentication, counted like a request's (401, or 429 from an
    address over the limit), or 404 (no such job, or not the caller's)."""
    with services.session_factory() as s:
        principal = authenticate(s, token)
        if principal is not None:
            job = get_job(s, job_id)
            return principal if job is not None and principal.can_see(job) else NotFound()
        reason = refusal(s, token)
    return failed_authentication(services, address, reason)


BATCH_DOC = (
    "Group metric and event messages into `batch` frames "
    '(`{"type": "batch", "cursor": C, "items": [...]}`, C = the last item\'s cursor).'
)


@router.websocket("/{job_id}/ws")
async def watch_ws(
    ws: WebSocket, job_id: str, after: str | None = None, batch: bool = False
) -> None:
    """History after ``after``, then the live tail; ``end`` and close 1000 when the job ends.
    ``batch=true``: records grouped in ``batch`` frames."""
    services = ws.app.state.services
    token, subprotocol = ws_credentials(ws)
    principal = await anyio.to_thread.run_sync(watcher, services, token, job_id, client_address(ws))
    if isinstance(principal, TooMany):
        # The limiter's own answer, as over HTTP: 429 with Retry-After and the JSON body.
        await ws.send_denial_response(
            error_response(principal.status, principal.code, principal.detail, principal.headers)
        )
        closed("WebSocket", job_id, None, 429, "refused: too many failed authentications")
        return
    if not isinstance(principal, Principal):
        await ws.close(code=CLOSE_POLICY)
        closed(
            "WebSocket", job_id, None, CLOSE_POLICY, "refused: bad token or not the caller's job"
        )
        return
    await ws.accept(subprotocol="bearer" if subprotocol else None)
    try:
        cursor = None if after is None else Cursor.parse(after)
    except CursorError as exc:
        await _close(ws, CLOSE_BAD_CURSOR, f"after: {exc}")
        closed("WebSocket", job_id, principal.name, CLOSE_BAD_CURSOR, f"after: {exc}")
        return
    session = LiveSession(services, principal, job_id, "WebSocket")
    refused = await anyio.to_thread.run_sync(session.acquire)
    if refused:
        await _close(ws, CLOSE_TOO_MANY, refused)
        await session.finish(CLOSE_TOO_MANY, refused)
        return
    code, reason = None, "server stopped serving it"
    try:
        code, reason = await _serve(ws, session, open_watch(ws.app, job_id, cursor), batch)
    finally:
        await session.finish(code, reason)


async def _serve(
    ws: WebSocket, session: LiveSession, watch: Watch, batch: bool
) -> tuple[int | None, str]:
    """Pump messages until the job ends, the client leaves or must go: (close code, why)."""
    pump = asyncio.create_task(_pump(ws, watch, session, batch))
    listen = asyncio.create_task(_until_disconnect(ws))
    cut = asyncio.create_task(watch.overflowed.wait())
    outcome: tuple[int | None, str] = (None, "client disconnected")
    try:
        done, _ = await asyncio.wait({pump, listen, cut}, return_when=asyncio.FIRST_COMPLETED)
        if cut in done and pump not in done:
            # Give a slow client the chance to read its gap; a stalled one is cut off.
            done, _ = await asyncio.wait(
                {pump, listen}, timeout=GAP_GRACE_S, return_when=asyncio.FIRST_COMPLETED
            )
            outcome = (None, "stalled: did not read its gap")
        if pump in done and not pump.cancelled():
            if pump.exception() is not None:
                log.error("live watcher failed", exc_info=pump.exception())
                await _close(ws, 1011, "server error")
                outcome = (1011, f"server error: {type(pump.exception()).__name__}")
            else:
                outcome = pump.result()
        elif listen in done:
            outcome = (None, "client disconnected")
    finally:
        for task in (pump, listen, cut):
            task.cancel()
        await asyncio.gather(pump, listen, cut, return_exceptions=True)
    return outcome


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    # A close frame's reason is at most 123 bytes.
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await ws.close(code=code, reason=reason.encode()[:120].decode(errors="ignore"))


async def _pump(
    ws: WebSocket, watch: Watch, session: LiveSession, batch: bool
) -> tuple[int | None, str]:
    try:
        async with contextlib.aclosing(watch.messages(batch=batch)) as messages:
            async for out in messages:
                problem = None if session.cleared() else await session.before_message()
                if problem:
                    await _close(ws, CLOSE_TOKEN, problem)
                    return CLOSE_TOKEN, problem
                await ws.send_text(out.text)
    except (WebSocketDisconnect, RuntimeError, OSError):
        return None, "client disconnected"
    if watch.overflowed.is_set():
        await _close(ws, CLOSE_GAP, "fell behind: reconnect with the gap's cursor")
        return CLOSE_GAP, "fell behind (gap)"
    await _close(ws, 1000, "job ended")
    return 1000, "job ended"


async def _until_disconnect(ws: WebSocket) -> None:
    """Clients send nothing we need; reading is how a disconnect is noticed."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


# -- Server-Sent Events -----------------------------------------------------------------


def sse_frame(out: Out) -> str:
    head = (
        f"id: {out.cursor}\n"
        if (out.type in RECORD_TYPES or out.type == "batch") and out.cursor
        else ""
    )
    return f"{head}event: {out.type}\ndata: {out.text}\n\n"


class _SSEResponse(StreamingResponse):
    """A StreamingResponse that gives up on a client that overflowed and stopped reading,
    and ends (with an ``error`` message saying why) once the token is revoked or expired."""

    def __init__(self, watch: Watch, session: LiveSession, batch: bool) -> None:
        self.watch = watch
        self.session = session
        self.batch = batch
        self.reason = "client disconnected"
        super().__init__(
            self._frames(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def _frames(self) -> AsyncIterator[str]:
        async with contextlib.aclosing(self.watch.messages(batch=self.batch)) as messages:
            async for out in messages:
                problem = await self.session.before_message()
                if problem:
                    self.reason = problem
                    yield f"event: error\ndata: {json.dumps({'error': 'unauthorized', 'detail': problem})}\n\n"
                    return
                yield sse_frame(out)
        self.reason = "fell behind (gap)" if self.watch.overflowed.is_set() else "job ended"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def guard() -> None:
                    await self.watch.overflowed.wait()
                    await anyio.sleep(GAP_GRACE_S)
                    self.reason = "stalled: did not read its gap"
                    tg.cancel_scope.cancel()

                tg.start_soon(guard)
                await super().__call__(scope, receive, send)
                tg.cancel_scope.cancel()
        finally:
            await self.session.finish(None, self.reason)


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses=error_responses(401, 404, 422, 429),
    summary="Follow a job live (Server-Sent Events)",
)
def watch_sse(
    job_id: str,
    request: Request,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    after: AfterCursor = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=48)] = None,
    batch: Annotated[bool, Query(description=BATCH_DOC)] = False,
) -> StreamingResponse:
    """The WebSocket's messages as Server-Sent Events; ``Last-Event-ID`` (or ``after``) resumes.
    A 429 when the caller already has its limit of live watchers open.

    Messages (``event:`` names the type; ``data:`` is JSON ``{"type", "cursor", "data"}``):
    ``metric``, ``event``, ``end``, ``heartbeat``, ``gap``; with ``batch=true``, metric and
    event messages come grouped as ``batch`` (``{"type", "cursor", "items"}``, ``id:`` the
    last item's cursor)."""
    visible_job(session, user, job_id)
    field, text = (
        ("header.Last-Event-ID", last_event_id) if last_event_id else ("query.after", after)
    )
    cursor = parse_cursor(text, field)
    live = LiveSession(services, user, job_id, "SSE")
    refused = live.acquire()
    if refused:
        closed("SSE", job_id, user.name, 429, refused)
        raise TooMany({"message": refused, "limit": services.live_slots.limit})
    return _SSEResponse(open_watch(request.app, job_id, cursor), live, batch)
