"""A job's checkpoints: the trained model is a user's main result, so it is downloadable.

Files are read through fsspec from ``AMPTRAIN_CHECKPOINT_URL`` (a directory
or any fsspec URL every worker writes to); names follow amptrain.contract.layout.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import fsspec
from fastapi import APIRouter, Path, Query, status
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from amptrain.contract.data_access import PathRefused, user_roots
from amptrain.contract.layout import (
    STEP_TEXT,
    checkpoint_name,
    checkpoint_step,
    job_checkpoint_url,
    weights_name,
)
from amptrain.contract.weights import export_file_name
from amptrain.server.web.deps import CurrentUser, ServicesDep, SessionDep, visible_job
from amptrain.server.web.errors import Conflict, NotFound, ValidationFailed, error_responses
from amptrain.server.weights_export import ExportExists, export_into

log = logging.getLogger(__name__)

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


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, summary="A job's checkpoints")
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


Step = Annotated[
    str, Path(pattern=STEP_TEXT, description="The step, a plain decimal integer (`500`).")
]
Format = Literal["pt", "safetensors"]


def _open(base: str, job_id: str, step: str, format: Format) -> tuple[Any, str]:
    """The checkpoint file of ``step`` (or its weights, ``safetensors``) and its name."""
    fs, root = fsspec.core.url_to_fs(job_checkpoint_url(base, job_id))
    name = checkpoint_name(int(step)) if format == "pt" else weights_name(int(step))
    try:
        return fs.open(f"{root}/{name}", "rb"), name
    except FileNotFoundError:
        what = "checkpoint" if format == "pt" else "safetensors export of a checkpoint"
        raise NotFound(f"job {job_id} has no {what} at step {step}") from None


@router.get(
    "/{job_id}/checkpoints/{step}",
    response_class=StreamingResponse,
    summary="Download a checkpoint",
)
def download_checkpoint(
    job_id: str,
    step: Step,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    format: Annotated[Format, Query(description="`safetensors`: the model's weights only.")] = "pt",
) -> StreamingResponse:
    """The checkpoint file (``torch.load(f, weights_only=True)``; the model is under
    ``"model"``), or with ``format=safetensors`` the model's weights alone as safetensors
    (the model library's own tensor names), which a spec's ``weights.path`` can start from."""
    visible_job(session, user, job_id)
    handle, name = _open(services.settings.checkpoint_url, job_id, step, format)

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


class ExportIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=100), AfterValidator(export_file_name)]
    """The file's name in your weights root (``.safetensors`` added when missing): letters,
    digits and ``. _ -``, starting with a letter or digit."""


class ExportOut(BaseModel):
    path: str
    """What a spec's ``weights.path`` names to start from it."""
    size: int
    """Bytes."""


@router.post(
    "/{job_id}/checkpoints/{step}/export",
    status_code=status.HTTP_201_CREATED,
    response_model=ExportOut,
    responses=error_responses(400, 409),
    summary="Export a checkpoint's weights as safetensors",
)
def export_checkpoint(
    job_id: str,
    step: Step,
    body: ExportIn,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> ExportOut:
    """Copy the checkpoint's weights (safetensors) into your weights root as ``name``, for
    the next job's ``weights.path``; an existing file of that name is a 409, never replaced."""
    visible_job(session, user, job_id)
    settings = services.settings
    per_user = settings.data_roots_per_user
    try:
        user_roots([], user.name, per_user)  # a name that cannot name a directory: refused
    except PathRefused as exc:
        raise ValidationFailed.one("name", str(exc).replace("file datasets", "weights")) from None
    handle, _ = _open(settings.checkpoint_url, job_id, step, "safetensors")
    with handle:
        try:
            size = export_into(
                str(settings.weights_roots[0]), user.name if per_user else None, body.name, handle
            )
        except ExportExists:
            raise Conflict(
                f"a weights file {body.name} exists already; choose another name"
            ) from None
        except OSError as exc:  # e.g. a symlink where the user's directory should be
            log.warning("export of job %s step %s failed: %r", job_id, step, exc)
            raise Conflict("your weights directory cannot be written; ask the operator") from None
    return ExportOut(path=body.name, size=size)
