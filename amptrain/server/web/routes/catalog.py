"""What can be trained: models, datasets, optimizers, schedules and precisions."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter

from amptrain.contract import catalog as core_catalog
from amptrain.server.web.deps import CurrentUser
from amptrain.server.web.errors import error_responses

router = APIRouter(tags=["catalog"], responses=error_responses(401))


@functools.cache
def _catalog() -> dict[str, Any]:
    # Registrations are fixed for the life of the process (plugins load at start).
    return core_catalog.catalog()


@router.get("/catalog", summary="Models, datasets and metrics a spec may name")
def get_catalog(user: CurrentUser) -> dict[str, Any]:
    """The registered models, datasets, optimizers and precisions with their arguments."""
    return _catalog()
