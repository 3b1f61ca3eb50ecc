"""A job's checkpoints: the trained model is a user's main result, so it is downloadable.

Files are read through fsspec from ``AMPTRAIN_CHECKPOINT_URL`` (a directory
or any fsspec URL every worker writes to); names follow amptrain.contract.layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import fsspec
from fastapi import APIRouter, Path
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from amptrain.contract.layout import (
    STEP_TEXT,
    checkpoint_name,
    checkpoint_step,
    job_checkpoint_url,
)
from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep, visible_job
from amptrain.server.web.errors import NotFound, error_responses

router = APIRouter(prefix="/jobs", tags=["checkpoints"], responses=error_responses(401, 404, 422))

CHUNK = 1 << 20


class CheckpointOut(BaseModel):
    step: int
    size: int
    """Bytes."""
    url: str
    """Where to download it (relative to the API)."""


class CheckpointList(BaseModel):
    items: list[CheckpointOut]


def _listing(base: str, job_id: str) -> list[dict[str, Any]]:
    fs, root = fsspec.core.url_to_fs(job_checkpoint_url(base, job_id))
    if not fs.exists(root):
        return []
    return list(fs.ls(root, detail=True))


@router.get("/{job_id}/checkpoints", response_model=CheckpointList)
def list_checkpoints(
    job_id: str, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> CheckpointList:
    """Complete checkpoints of the job, oldest first (older ones are pruned per ``checkpoint.keep_last``)."""
    visible_job(session, user, job_id)
    found = []
    for entry in _listing(services.settings.checkpoint_url, job_id):
        step = checkpoint_step(entry["name"])
        if step is not None:
            found.append(
                CheckpointOut(
                    step=step,
                    size=int(entry.get("size") or 0),
                    url=f"/jobs/{job_id}/checkpoints/{step}",
                )
            )
    return CheckpointList(items=sorted(found, key=lambda c: c.step))


@router.get("/{job_id}/checkpoints/{step}", response_class=StreamingResponse)
def download_checkpoint(
    job_id: str,
    step: Annotated[
        str, Path(pattern=STEP_TEXT, description="The step, a plain decimal integer (`500`).")
    ],
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> StreamingResponse:
    """The checkpoint file (``torch.load(f, weights_only=True)``; the model is under ``"model"``)."""
    visible_job(session, user, job_id)
    fs, root = fsspec.core.url_to_fs(job_checkpoint_url(services.settings.checkpoint_url, job_id))
    name = checkpoint_name(int(step))
    path = f"{root}/{name}"
    try:
        handle = fs.open(path, "rb")
    except FileNotFoundError:
        raise NotFound(f"job {job_id} has no checkpoint at step {step}") from None

    def chunks() -> Iterator[bytes]:
        with handle:
            while chunk := handle.read(CHUNK):
                yield chunk

    filename = f"{job_id}-{name}"
    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
