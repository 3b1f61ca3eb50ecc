"""One error hierarchy, one JSON shape: ``{"error": CODE, "detail": ...}``.

Handlers raise :class:`AppError` subclasses; :func:`install_error_handlers`
maps them (and FastAPI's request validation, Starlette's HTTP errors and
anything unexpected) to that shape. A 422 names every bad field as
``{"field": "optimizer.lr", "message": ...}``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from amptrain.core.logs import shown

log = logging.getLogger(__name__)


class AppError(Exception):
    """Base of every error a handler raises on purpose."""

    status: int = 500
    code: str = "internal"

    def __init__(self, detail: Any = None, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail if detail is not None else self.code.replace("_", " ")
        self.headers = headers


class Unauthorized(AppError):
    status, code = 401, "unauthorized"

    def __init__(self, detail: Any = "missing or invalid bearer token") -> None:
        super().__init__(detail, headers={"WWW-Authenticate": "Bearer"})


class NotFound(AppError):
    status, code = 404, "not_found"


class Conflict(AppError):
    status, code = 409, "conflict"


class ValidationFailed(AppError):
    """A 422 with one ``{"field", "message"}`` per problem."""

    status, code = 422, "validation_error"

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__(problems)

    @classmethod
    def one(cls, field: str, message: str) -> ValidationFailed:
        """A 422 with the single problem ``message`` at ``field`` (``query.after``, ``name``)."""
        return cls([{"field": field, "message": message, "type": "value_error"}])


class Unavailable(AppError):
    status, code = 503, "unavailable"


class TooMany(AppError):
    """A 429: a per-user limit was reached (``detail`` says which, the limit and the use)."""

    status, code = 429, "too_many_requests"


class ErrorBody(BaseModel):
    """Every error response: a stable ``error`` code and a ``detail`` (a message, or for
    ``validation_error`` one ``{"field", "message", "type"}`` per problem)."""

    error: str
    detail: Any


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: the listed statuses, documented with :class:`ErrorBody`
    (a route that authenticates can also answer 429: its address failed too often)."""
    listed = set(statuses) | ({429} if 401 in statuses else set())
    return {
        status: {"model": ErrorBody, "description": _DESCRIPTIONS.get(status, "Error")}
        for status in sorted(listed)
    }


_DESCRIPTIONS = {
    400: "Bad request",
    401: "Missing, unknown, expired or revoked bearer token",
    404: "No such resource, or not the caller's",
    409: "Conflicts with the resource's state",
    413: "Request body too large",
    422: "Invalid parameters or body, one entry per bad field",
    429: "A per-user limit was reached, or the caller's address failed to authenticate too "
    "often (``Retry-After`` for the write rate and the failures)",
    503: "A backing service is unavailable",
}

QUOTE_MAX = 40
"""Characters of a user's value an error message may quote: enough to recognise it,
never a whole (possibly huge or secret) input."""
MESSAGE_MAX = 500
# A quote, then more than QUOTE_MAX characters up to the matching quote (or the end):
# linear, whatever the input.
# A quoted value whole, short ones too: the scan consumes each pair, so a closing quote is
# never taken for the opening one of the text up to the next value.
_QUOTED = re.compile(r"""(['"])([^'"]*)\1?""")


def shorten(message: str) -> str:
    """``message`` with every quoted value cut to its first :data:`QUOTE_MAX` characters
    and the whole bounded by :data:`MESSAGE_MAX`."""

    def cut(match: re.Match[str]) -> str:
        quote, value = match.group(1), match.group(2)
        if len(value) <= QUOTE_MAX:
            return match.group(0)
        return f"{quote}{value[:QUOTE_MAX]}...{quote} ({len(value)} characters)"

    short = _QUOTED.sub(cut, message)
    return short if len(short) <= MESSAGE_MAX else short[:MESSAGE_MAX] + "..."


def clip(text: str) -> str:
    """``text`` cut to :data:`QUOTE_MAX` characters (for a user's id or key in a message)."""
    return text if len(text) <= QUOTE_MAX else f"{text[:QUOTE_MAX]}..."


def field_problems(
    errors: Iterable[Any], *, strip: Sequence[str] = ("body",)
) -> list[dict[str, Any]]:
    """Pydantic/FastAPI error dicts -> ``[{"field": "optimizer.lr", "message": ..., "type": ...}]``.

    The leading location (``body``, ``query``, ...) is dropped for the body, so the
    field path reads like the spec the user wrote; query and path parameters keep it
    (``query.limit``) because there it tells where to look.
    """
    out = []
    for err in errors:
        # A location can be a user's dict key: cut like a quoted value.
        loc = [clip(str(part)) for part in err.get("loc", ())]
        if loc and loc[0] in strip:
            loc = loc[1:]
        out.append(
            {
                "field": ".".join(loc) or "body",
                "message": shorten(str(err.get("msg", "invalid"))),
                "type": str(err.get("type", "value_error")),
            }
        )
    return out


def error_response(
    status: int, code: str, detail: Any, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


def allowed_methods(request: Request) -> str:
    """Every method the API documents at this path (Starlette's 405 names only the first
    matching route's, though e.g. ``GET /jobs`` and ``POST /jobs`` are two routes)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi().get("paths", {}).items():
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, request.url.path):
            methods |= {m.upper() for m in operations if m.upper() in _METHODS}
    return ", ".join(sorted(methods))


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through the ``{"error", "detail"}`` shape."""

    @app.exception_handler(AppError)
    async def _app_error(request: Request, exc: AppError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.detail, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, ValidationFailed.code, field_problems(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _pydantic_validation(request: Request, exc: ValidationError) -> JSONResponse:
        return error_response(422, ValidationFailed.code, field_problems(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "internal" if exc.status_code >= 500 else "error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return error_response(exc.status_code, code, exc.detail, headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, shown(request.url.path, 200))
        return error_response(500, "internal", "internal server error")
