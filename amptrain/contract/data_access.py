"""Where file datasets may read: data roots, allowed protocols, per-user sub-roots.

Torch-free and fsspec-free on purpose. A dataset path is user input on a shared
service: it is parsed and checked here, as text, *before* any filesystem object
exists, because building one can already connect somewhere (fsspec's FTP
filesystem logs in when it is created). The API runs the same check at submit
time (without touching files); the worker runs it again and resolves symlinks.

* A relative path is looked up under each data root in turn.
* An absolute path or ``file://`` URL must lie under a local root (after ``..``
  and, on the worker, symlinks are resolved).
* Another URL needs its protocol allowed and must lie under a root of the same
  protocol and authority (``s3://bucket/team`` allows ``s3://bucket/team/x.npz``,
  not ``s3://other-bucket/...`` nor ``ftp://host/...``).
* With per-user roots, each root ``R`` stands for ``R/<owner>`` for that owner.

The worker never resolves the user's part of a local path (:func:`locate`): resolving
and then opening the string again races with anyone who swaps a directory of it for a
symlink in between. It gets a :class:`Beneath` instead, the root resolved once (an
operator may reach a root through symlinks) and the rest to be walked from the root's
descriptor without following any symlink (``amptrain.components.beneath``).

Refusals say what is wrong with the path the user wrote; they never show the
roots' absolute paths or where the worker runs.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

LOCAL = "file"
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_URL_FORBIDDEN = re.compile(r"[?#%\\\x00-\x1f\x7f]")
_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")


class PathRefused(ValueError):
    """A dataset path that may not be read; the message names the problem, not the roots."""


@dataclass(frozen=True)
class Location:
    """A parsed path: ``protocol`` (``file`` for local files) and a normalised absolute
    ``path`` (for URLs the authority comes first: ``/bucket/key`` of ``s3://bucket/key``)."""

    protocol: str
    path: str

    @property
    def url(self) -> str:
        """What to open: the local path, or the URL rebuilt from the normalised parts."""
        return self.path if self.protocol == LOCAL else f"{self.protocol}://{self.path[1:]}"

    def inside(self, root: Location) -> bool:
        if self.protocol != root.protocol:
            return False
        base = root.path.rstrip("/") or "/"
        return self.path == base or self.path.startswith(base.rstrip("/") + "/")


def parse(text: str) -> Location | str:
    """A :class:`Location` for a URL or absolute path; a relative local path comes back
    as the normalised relative text. Raises :class:`PathRefused` for what cannot be read."""
    if "::" in text:
        raise PathRefused("chained URLs (with '::') are not supported")
    if "\x00" in text:
        raise PathRefused("must not contain NUL characters")
    match = _URL.match(text)
    if match is None:
        if "://" in text:
            raise PathRefused("not a valid URL")
        if os.path.isabs(text):
            return Location(LOCAL, os.path.normpath(text))
        relative = os.path.normpath(text)
        if relative == ".." or relative.startswith("../"):
            raise PathRefused("a relative path must stay inside the data roots (no '..')")
        return relative
    protocol, rest = match[1].lower(), match[2]
    if protocol == LOCAL:
        if not rest.startswith("/"):
            raise PathRefused("a file:// URL must name an absolute path (file:///...)")
        return Location(LOCAL, os.path.normpath(rest))
    if _URL_FORBIDDEN.search(rest):
        raise PathRefused("a URL must not contain '?', '#', '%', backslashes or control characters")
    return Location(protocol, posixpath.normpath("/" + rest))


def user_roots(roots: Iterable[str], owner: str | None, per_user: bool) -> list[str]:
    """The roots ``owner`` may read: ``roots`` themselves, or each one's ``<owner>`` child."""
    roots = list(roots)
    if not per_user:
        return roots
    if owner is None or not _OWNER.match(owner):
        raise PathRefused(
            "file datasets are per user here, and this user's name cannot name a data "
            "directory (letters, digits and . _ @ + - only)"
        )
    return [f"{root.rstrip('/')}/{owner}" for root in roots]


@dataclass(frozen=True)
class Beneath:
    """A local file as the worker opens it: ``relative`` (normalised: no ``..``, ``.`` or
    empty component) walked beneath ``root``, which is resolved once, without following
    any symlink."""

    root: str
    relative: str

    def __str__(self) -> str:  # for logs and suffixes only: opening this string would race
        return os.path.join(self.root, self.relative)


def locate(
    text: str, roots: Sequence[str], protocols: Iterable[str] | None = None
) -> list[str | Beneath]:
    """What the worker opens for ``text``, in order: a URL as checked, or for a local path
    one :class:`Beneath` per local root it may lie under (several only for a relative path).
    Nothing of the user's path is resolved here; :class:`PathRefused` as for
    :func:`check_location`."""
    parsed_roots, target = _checked(text, roots, protocols)
    local = [r for r in parsed_roots if r.protocol == LOCAL]
    if isinstance(target, str):
        return [Beneath(os.path.realpath(r.path), target) for r in local]
    if target.protocol != LOCAL:
        return [target.url]
    found: list[str | Beneath] = []
    for root in local:
        real = os.path.realpath(root.path)  # the operator's symlinks, resolved once
        for base in (root.path, real):  # the user may name the root either way
            if target.inside(Location(LOCAL, base)):
                rest = target.path[len(base.rstrip("/")) :].lstrip("/")
                found.append(Beneath(real, rest))
                break
    if not found:
        raise PathRefused("is outside the allowed data roots")
    return found


def _checked(
    text: str, roots: Sequence[str], protocols: Iterable[str] | None
) -> tuple[list[Location], Location | str]:
    """The parsed roots and the parsed ``text``, refused when no root could hold it: a
    relative path without a local root, a protocol not allowed, a URL under no root."""
    if not roots:
        raise PathRefused("file datasets are disabled here (no data roots are configured)")
    parsed_roots = [_root(r) for r in roots]
    allowed = {p.lower() for p in protocols} if protocols is not None else None
    if allowed is None:
        allowed = {r.protocol for r in parsed_roots}
    target = parse(text)
    if isinstance(target, str):  # relative: under each local root
        if LOCAL not in allowed or not any(r.protocol == LOCAL for r in parsed_roots):
            raise PathRefused("a relative path needs a local data root, and none is configured")
        return parsed_roots, target
    if target.protocol not in allowed:
        names = ", ".join(sorted(allowed)) or "none"
        raise PathRefused(f"protocol {target.protocol!r} is not allowed here (allowed: {names})")
    if target.protocol != LOCAL and not any(target.inside(r) for r in parsed_roots):
        raise PathRefused("is outside the allowed data roots")
    return parsed_roots, target


def check_location(
    text: str,
    roots: Sequence[str],
    protocols: Iterable[str] | None = None,
    *,
    resolve: bool = True,
) -> list[str]:
    """Candidates to open for ``text``, in order (several only for a relative path: one
    under each local root); :class:`PathRefused` when it may not be read at all.

    ``protocols`` defaults to those of the roots. ``resolve`` follows symlinks (the
    worker); without it (the API) a local path passes when it lies under a root either
    as written or as resolved on this machine, so the API is never stricter than the
    worker, which checks again. The worker opens what :func:`locate` gives instead: a
    resolved string may name something else by the time it is opened.
    """
    parsed_roots, target = _checked(text, roots, protocols)
    if isinstance(target, str):  # relative: under each local root
        local = [r for r in parsed_roots if r.protocol == LOCAL]
        found = [_under(r, target, resolve) for r in local]
        candidates = [c for c in found if c is not None]
        if not candidates:  # every one resolved out of its root (a symlink)
            raise PathRefused("is outside the allowed data roots")
        return candidates
    if target.protocol != LOCAL:
        return [target.url]
    resolved = _resolve(target.path)
    inside = resolved is not None and any(resolved.inside(_resolved_root(r)) for r in parsed_roots)
    if not inside and not resolve:
        inside = any(target.inside(r) for r in parsed_roots)
    if not inside:
        raise PathRefused("is outside the allowed data roots")
    return [resolved.path if resolve and resolved is not None else target.path]


def _resolve(path: str) -> Location | None:
    """``path`` with symlinks resolved; None when that fails (``realpath`` raises
    ``EINVAL`` or ``ELOOP`` on a path that changes under it): a refusal, not a crash."""
    try:
        return Location(LOCAL, str(Path(path).resolve()))
    except (OSError, RuntimeError):
        return None


def _root(text: str) -> Location:
    parsed = parse(text)
    if isinstance(parsed, str):  # a relative root is relative to where the process runs
        return Location(LOCAL, os.path.abspath(parsed))
    return parsed


def _resolved_root(root: Location) -> Location:
    return Location(LOCAL, str(Path(root.path).resolve())) if root.protocol == LOCAL else root


def _under(root: Location, relative: str, resolve: bool) -> str | None:
    """``root/relative``; on the worker resolved, and None when that leaves the root."""
    joined = os.path.join(root.path, relative)
    if not resolve:
        return os.path.normpath(joined)
    resolved = _resolve(joined)
    return resolved.path if resolved and resolved.inside(_resolved_root(root)) else None
