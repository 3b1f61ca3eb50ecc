"""Logging for every amptrain process: one JSON object per line, or readable text.

``configure_logging(format, component=...)`` installs one handler on the root
logger; the API, the worker and their libraries (uvicorn, Celery) log through
it. Every record carries ``job_id``, ``attempt`` and ``worker`` when known:
from :func:`log_context` (a context variable, so it follows the code that runs
one job) or from ``extra={...}`` on the call itself. ``json`` is the default
(log shippers parse it); ``amptrain up`` sets ``text`` for people.

FastAPI-free: the worker imports it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from typing import Any, Literal

CONTEXT_FIELDS: tuple[str, ...] = ("job_id", "attempt", "worker")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "amptrain_log_context", default=None
)

# Attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName", "color_message", "component", "ctx", *CONTEXT_FIELDS}
)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (e.g. ``job_id``, ``attempt``) to every record logged inside the block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add ``fields`` to the context for the rest of this thread/task (e.g. the worker name)."""
    _context.set({**(_context.get() or {}), **fields})


class _ContextFilter(logging.Filter):
    """Copies the context variable onto each record, unless ``extra=`` already set a field."""

    def __init__(self, static: dict[str, Any]) -> None:
        super().__init__()
        self.static = static

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = {**self.static, **(_context.get() or {})}
        for name in CONTEXT_FIELDS:
            if getattr(record, name, None) is None:
                setattr(record, name, ctx.get(name))
        if getattr(record, "component", None) is None:
            record.component = ctx.get("component")
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, context fields, extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("component", *CONTEXT_FIELDS):
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key not in out and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS component level logger [job #attempt] message`` for a terminal."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(component)-6s %(levelname)-7s %(name)s%(ctx)s %(message)s", "%H:%M:%S"
        )

    def format(self, record: logging.LogRecord) -> str:
        job, attempt = getattr(record, "job_id", None), getattr(record, "attempt", None)
        ctx = ""
        if job:
            ctx = f" [{job}" + (f" #{attempt}" if attempt is not None else "") + "]"
        record.ctx = ctx
        return super().format(record)


def make_handler(
    fmt: Literal["json", "text"], *, component: str | None = None, stream: Any = None
) -> logging.Handler:
    """A stream handler (stderr by default) with the chosen format and the context filter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_ContextFilter({"component": component}))
    return handler


def configure_logging(
    fmt: Literal["json", "text"],
    *,
    component: str,
    level: int | str = logging.INFO,
    stream: Any = None,
) -> None:
    """Route every logger of this process through one handler of format ``fmt``.

    Replaces existing root handlers and makes uvicorn's and Celery's loggers
    propagate to the root instead of printing with their own formats.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(make_handler(fmt, component=component, stream=stream))
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "celery.task"):
        lib = logging.getLogger(name)
        lib.handlers.clear()
        lib.propagate = True


LIBRARY_LOGGERS = ("celery", "kombu", "uvicorn", "uvicorn.error", "uvicorn.access")
"""The loggers of the libraries amptrain runs on (their children follow them)."""


def quiet_libraries(level: int = logging.WARNING) -> None:
    """Keep Celery's and uvicorn's own lines below ``level`` out (amptrain's lines keep the
    process's level): ``amptrain up``'s terminal shows what amptrain says, not "Connected
    to redis+socket://..." or "Waiting for application startup"."""
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)


_UNSAFE = re.compile(r"[^A-Za-z0-9.:_\-\[\] ,/@]")
"""Everything but what addresses, ports and host lists are written with."""


def shown(value: object, limit: int = 80) -> str:
    """``value`` (something a client sent: an address, a forwarded header) safe to log:
    its first ``limit`` characters with every control, markup, quote, backslash or
    non-ASCII character escaped (``<`` is ``\\x3c``), so a log line or a log viewer never
    renders what a client wrote. An IP address comes out unchanged."""
    text = str(value)
    out = _UNSAFE.sub(lambda m: _escape(ord(m[0])), text[:limit])
    return out + ("..." if len(text) > limit else "")


def _escape(code: int) -> str:
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _iso(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"
