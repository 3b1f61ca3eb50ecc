"""The documentation site under ``/guide/``: the folder ``amptrain up`` builds with MkDocs
(``{data_dir}/guide``: :data:`amptrain.core.settings.GUIDE_DIR`, see :mod:`amptrain.cli.guide`), served as static files.

``/docs`` stays FastAPI's Swagger UI. Each page gets a Content-Security-Policy that keeps
it to the service's own origin, its inline scripts allowed by hash as on ``/docs``
(:func:`amptrain.server.web.docs_csp.policy_for`); the site's search runs in a web worker
from the site itself. Pages are revalidated on each load (a rebuilt site is never served
stale).
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from amptrain.core.settings import GUIDE_DIR
from amptrain.server.web.deps import ServicesDep
from amptrain.server.web.docs_csp import policy_for
from amptrain.server.web.errors import NotFound

router = APIRouter(include_in_schema=False)


class _Site(StaticFiles):
    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = "no-cache"
        if str(full_path).endswith(".html"):
            # Pages are small: read once more to name their inline scripts by hash.
            response.headers["Content-Security-Policy"] = policy_for(Path(full_path).read_bytes())
            response.headers["Referrer-Policy"] = "no-referrer"
        return response


_sites: dict[Path, _Site] = {}


@router.get("/guide")
def to_guide() -> RedirectResponse:
    return RedirectResponse("/guide/", status_code=307)


@router.api_route("/guide/{path:path}", methods=["GET", "HEAD"])
async def guide_file(path: str, request: Request, services: ServicesDep) -> Response:
    """A file of the built site; ``/guide/`` is its home page."""
    site = services.settings.data_dir / GUIDE_DIR
    if not (site / "index.html").is_file():
        raise NotFound(
            "the documentation site is not built here: `amptrain up` builds it from a "
            'checkout with the docs extra (pip install -e ".[docs]"); or read docs/ in '
            "the repository"
        )
    static = _sites.setdefault(site, _Site(directory=site, html=True))
    return await static.get_response(path or "index.html", request.scope)
