"""What the supervisor and the training child say to each other (torch-free).

The supervisor (a Celery pool process) starts the child with a :class:`Launch`
as JSON on its stdin; the child answers with control messages on a pipe, one
JSON object per line, each tagged with its ``type``: :class:`Accepted` as soon as
it holds the launch, :class:`PrecisionChosen` once training is set up, then
:class:`Finished` or :class:`Failed`. A warm spare (:mod:`amptrain.worker.child.spare`)
gets its launch the same way, only later. Both sides
use :func:`encode` / :func:`decode`, which validate every field.

The supervisor imports this module; it must never import the child's other
modules, which pull in torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ForkStart(_Message):
    """A fork's first state: its parent's checkpoint (see :mod:`amptrain.contract.forks`)."""

    parent: str
    step: int
    checkpoint_dir: str
    """The parent's checkpoint directory, built by the supervisor from the service's
    checkpoint root and the parent's id."""


class Launch(_Message):
    """What one attempt needs; travels as JSON on the child's stdin."""

    job_id: str
    attempt: int
    spec: dict[str, Any]
    checkpoint_dir: str
    redis_url: str
    data_roots: list[str] = Field(default_factory=list)
    weights_roots: list[str] = Field(default_factory=list)
    """Where the owner's ``weights.path`` may be read (``ROOT/<owner>`` with per-user roots)."""
    recorded: dict[int, int] | None = None
    """Per attempt, the newest step of its history in SQL: the attempt resumes only from a
    checkpoint its writer recorded through (see
    :attr:`amptrain.engine.context.RunContext.recorded`); None on a first attempt."""
    control_fd: int = -1
    """The write end of the control pipe, inherited by the child."""
    cpu_bf16_probe: dict[str, Any] | None = None
    """The worker's bf16-vs-fp32 measurement on its CPU (from its capability report), so
    ``precision: auto`` decides the same for every job here; None: the child measures."""
    precision_cache: str | None = None
    """The worker's file of ``precision: auto`` decisions per model, shapes and device
    (:mod:`amptrain.worker.child.precision_cache`); None: the child's own, forgotten after."""
    precision_override: str | None = None
    """After a precision fallback: the precision this attempt trains in (see
    :attr:`amptrain.engine.context.RunContext.precision_override`)."""
    fork: ForkStart | None = None
    """A fork's parent checkpoint: used while the job has no checkpoint of its own."""


class Accepted(_Message):
    """The child holds its launch and will train it: the first message of every attempt."""

    type: Literal["accepted"] = "accepted"
    pid: int
    warm: bool
    """True: a spare started before the job, with torch already imported."""
    cuda_initialized: bool
    """Whether CUDA was initialised in this process before the launch; always False from
    a healthy child (a spare that finds it True refuses the launch instead)."""


class PrecisionChosen(_Message):
    """The precision the run trains with; the supervisor records it with ``started``."""

    type: Literal["precision"] = "precision"
    requested: str
    effective: str
    reason: str
    device: str | None = None
    measurement: dict[str, Any] | None = None
    """``auto`` by measurement: what the probe timed and how long it took (None: a rule)."""

    @property
    def reason_on_device(self) -> str:
        """The reason, naming the device it was decided for (e.g. the GPU model)."""
        return f"{self.reason}; device: {self.device}" if self.device else self.reason

    def event_data(self) -> dict[str, Any]:
        """As shown in the ``started`` event."""
        exclude = {"type"} if self.measurement is not None else {"type", "measurement"}
        return self.model_dump(exclude=exclude)


class Finished(_Message):
    """Training reached its end (``max_steps``), or stopped cleanly on request."""

    type: Literal["result"] = "result"
    final_step: int
    resumed_from: int | None
    skipped_steps: int
    dropped_records: int


class Failed(_Message):
    """Training could not go on; ``retryable`` says whether another attempt could succeed."""

    type: Literal["error"] = "error"
    code: str
    message: str
    step: int | None
    retryable: bool
    fallback_to: str | None = None
    """A precision fallback (``health.fallback``): the precision the next attempt trains in."""

    def error(self) -> dict[str, Any]:
        """The job's ``error`` as stored and shown to the user."""
        return {"code": self.code, "message": self.message, "step": self.step}


ControlMessage = Accepted | PrecisionChosen | Finished | Failed
_CONTROL: TypeAdapter[ControlMessage] = TypeAdapter(
    Annotated[ControlMessage, Field(discriminator="type")]
)


class ProtocolError(ValueError):
    """A control line that is not one of the messages above."""


def encode(message: ControlMessage) -> str:
    """One line of the control pipe (newline included)."""
    return message.model_dump_json() + "\n"


def decode(line: str) -> ControlMessage:
    """The message on one line of the control pipe; :class:`ProtocolError` if it is none."""
    try:
        return _CONTROL.validate_json(line)
    except ValidationError as exc:
        raise ProtocolError(f"bad control message {line[:200]!r}: {exc}") from exc
