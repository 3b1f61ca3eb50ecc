"""Alert rules as a user writes them (``POST /alerts/rules``, a job spec's ``alerts``), and
the event names a rule may match, defined once.

Torch-free like every contract module. A rule says *when* (``when``: an event, a series
crossing a threshold or deviating from its recent window, no progress, or an early-stopping
criterion), *which jobs* (``scope``: all of its owner's, a name pattern, one job) and *what
to do* (``notify``: a webhook; ``stop``: cancel with a checkpoint). Every value is bounded
and floats are finite (NaN/inf refused): a rule is user input evaluated by the recorder on
every batch. Whether a webhook's host is allowed is the service's setting, checked by the
API (:mod:`amptrain.server.web.routes.alerts`), not here.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from amptrain.contract.health_spec import StrictModel
from amptrain.contract.metrics import BY_NAME, SERIES_NAME, check_series_name
from amptrain.contract.records import OVERFLOW_WARNING
from amptrain.contract.records import SPIKE_WARNING as SPIKE_WARNING
from amptrain.contract.text import check_text

MAX_RULES_PER_OWNER = 100
MAX_RULES_PER_JOB_SPEC = 10
MAX_RULE_NAME = 100
MAX_URL = 2048
MAX_GLOB = 100
MAX_GLOB_WILDCARDS = 4
"""``*`` and ``?`` in a name pattern: a pattern is matched against every job's name."""
MAX_WINDOW = 1000
"""Points of a deviation rule's window: the recorder reads them per job and batch."""
MAX_Z = 1000.0
MAX_THRESHOLD = 1e300
MAX_PATIENCE = 10_000
MAX_NO_PROGRESS_S = 7 * 24 * 3600
MIN_NO_PROGRESS_S = 5
MAX_RETRIES = 10
MAX_JOB_ID = 40

DIVERGED = "diverged"
"""Not an event type of its own: a ``failed`` event whose error code is ``diverged``."""

AlertEvent = Literal[
    "failed",
    "diverged",
    "precision_fallback",
    "rollback",
    "loss_spike",
    "gradient_overflow",
    "succeeded",
    "cancelled",
    "requeued",
    "started",
    "resumed",
    "early_stopped",
]
ALERT_EVENTS: tuple[str, ...] = get_args(AlertEvent)
"""What an ``event`` rule may name: recorded event types, and two warning codes (a
``warning`` event's ``data.code``) and ``diverged`` (a ``failed`` event's error code),
which users think of as events of their own. :func:`event_names` maps a recorded event
to these names."""

EARLY_STOPPED = "early_stopped"
"""The event of an early-stopping rule that fired: ``rule`` (id and name), ``series``,
``step``, ``value`` and ``reason`` (``target`` or ``patience``). The job then stops with
a checkpoint and ends ``succeeded``."""
ALERT_STOP = "alert_stop"
"""The event of a ``stop`` action that fired: ``rule`` (id and name) and what matched.
The job then stops with a checkpoint and ends ``cancelled``, its event naming the rule."""


def event_names(type_: str, data: Any) -> tuple[str, ...]:
    """The :data:`ALERT_EVENTS` names a recorded event (``type``, ``data``) answers to."""
    data = data if isinstance(data, dict) else {}
    if type_ == "warning":
        code = data.get("code")
        return (code,) if code in (SPIKE_WARNING, OVERFLOW_WARNING) else ()
    if type_ == "failed":
        error = data.get("error") if isinstance(data.get("error"), dict) else data
        return ("failed", DIVERGED) if error.get("code") == DIVERGED else ("failed",)
    return (type_,) if type_ in ALERT_EVENTS else ()


def check_series(name: str) -> str:
    """A series a rule may watch: a numeric step field of the metric table, or a valid
    evaluation series name (built-in or a plugin's)."""
    metric = BY_NAME.get(name)
    if metric is not None:
        # ``time`` is when the step ended, not a measurement of the run.
        if metric.type not in ("int", "float", "bytes") or metric.parallel or name == "time":
            raise ValueError(f"step field {name!r} is not a numeric series")
        return name
    if not isinstance(name, str) or not SERIES_NAME.fullmatch(name):
        raise ValueError(f"unknown series {name[:60]!r}")
    return check_series_name(name)


def is_step_series(name: str) -> bool:
    """The series is a field of every step (a ``step`` series), not an evaluation value."""
    return name in BY_NAME


Series = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(check_series)]
Finite = Annotated[float, Field(ge=-MAX_THRESHOLD, le=MAX_THRESHOLD)]


class EventWhen(StrictModel):
    kind: Literal["event"]
    """Fire on lifecycle and warning events (``GET /alerts/events`` lists their names)."""
    events: list[AlertEvent] = Field(min_length=1, max_length=len(ALERT_EVENTS))
    """Fire on any of these events of a matching job."""


class ThresholdWhen(StrictModel):
    kind: Literal["threshold"]
    """Fire when a series crosses a value."""
    series: Series
    """A step field (``loss``, ``grad_norm``...) or an evaluation series (``eval_loss``)."""
    above: Finite | None = None
    """Fire when the series crosses above this value (from at or below it)."""
    below: Finite | None = None
    """Fire when the series crosses below this value (from at or above it)."""

    @model_validator(mode="after")
    def _one_side(self) -> ThresholdWhen:
        if (self.above is None) == (self.below is None):
            raise ValueError("give exactly one of above, below")
        return self


class DeviationWhen(StrictModel):
    kind: Literal["deviation"]
    """Fire when a series moves far from its recent mean."""
    series: Series
    """A step field (``loss``, ``grad_norm``...) or an evaluation series (``eval_loss``)."""
    window: int = Field(default=50, ge=2, le=MAX_WINDOW)
    """The recent points the mean and standard deviation are taken over."""
    z: float = Field(default=4.0, gt=0, le=MAX_Z)
    """Fire when a value lies more than ``z`` standard deviations from the window's mean."""


class NoProgressWhen(StrictModel):
    kind: Literal["no_progress"]
    """Fire when a running job stops recording steps."""
    seconds: int = Field(ge=MIN_NO_PROGRESS_S, le=MAX_NO_PROGRESS_S)
    """Fire when a running job recorded no step for this long."""


class EarlyStopWhen(StrictModel):
    """Lightning's ``EarlyStopping`` on an evaluation series: stop when it reaches
    ``target``, or when it has not improved by more than ``min_delta`` for ``patience``
    evaluations in a row. The job ends ``succeeded``."""

    kind: Literal["early_stop"]
    """Stop the job when an evaluation series stops improving or reaches ``target``."""
    series: Series
    """An evaluation series (``eval_loss``, ``accuracy``...), not a step field."""
    mode: Literal["min", "max"] = "min"
    """``min``: lower is better (a loss); ``max``: higher is better (an accuracy)."""
    patience: int = Field(default=3, ge=1, le=MAX_PATIENCE)
    """Evaluations in a row without an improvement before the job stops."""
    min_delta: float = Field(default=0.0, ge=0, le=MAX_THRESHOLD)
    """How much a value must beat the best so far to count as an improvement."""
    target: Finite | None = None
    """Stop once the series is at or beyond this (below for ``min``, above for ``max``)."""

    @model_validator(mode="after")
    def _eval_series(self) -> EarlyStopWhen:
        if is_step_series(self.series):
            raise ValueError(f"early_stop watches an evaluation series, not {self.series!r}")
        return self


When = Annotated[
    EventWhen | ThresholdWhen | DeviationWhen | NoProgressWhen | EarlyStopWhen,
    Field(discriminator="kind"),
]


def check_url(url: str) -> str:
    """An ``http(s)`` URL with a host and no credentials (the host is checked against the
    service's allow-list by the API)."""
    check_text(url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("the webhook URL must be http:// or https://")
    if not parts.hostname:
        raise ValueError("the webhook URL has no host")
    if parts.username or parts.password:
        raise ValueError("the webhook URL must not carry credentials")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("the webhook URL has an invalid port") from None
    return url


class Notify(StrictModel):
    url: Annotated[str, Field(min_length=8, max_length=MAX_URL), AfterValidator(check_url)]
    """Where to POST the firing; its host must be on ``AMPTRAIN_WEBHOOK_ALLOWED_HOSTS``."""
    format: Literal["json", "slack"] = "json"
    """``slack``: a Slack-compatible ``{"text": ...}`` body (still signed)."""
    max_retries: int = Field(default=5, ge=0, le=MAX_RETRIES)
    """Attempts after the first, with exponential backoff."""


def check_glob(pattern: str) -> str:
    check_text(pattern)
    if sum(pattern.count(c) for c in "*?") > MAX_GLOB_WILDCARDS:
        raise ValueError(f"at most {MAX_GLOB_WILDCARDS} wildcards (* or ?)")
    if "[" in pattern:
        raise ValueError("only * and ? are wildcards")
    return pattern


class Scope(StrictModel):
    """Which of the owner's jobs: all (both null), those whose name matches ``name``
    (``*`` and ``?`` wildcards), or the one job ``job_id``."""

    name: (
        Annotated[str, Field(min_length=1, max_length=MAX_GLOB), AfterValidator(check_glob)] | None
    ) = None
    """Jobs whose name matches this pattern (``*`` and ``?`` wildcards)."""
    job_id: (
        Annotated[str, Field(min_length=1, max_length=MAX_JOB_ID, pattern=r"^[A-Za-z0-9_-]+$")]
        | None
    ) = None
    """The one job with this id."""

    @model_validator(mode="after")
    def _one(self) -> Scope:
        if self.name is not None and self.job_id is not None:
            raise ValueError("give at most one of name, job_id")
        return self


class JobAlert(StrictModel):
    """A rule of one job, in its spec's ``alerts`` list (its scope is that job)."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_RULE_NAME), AfterValidator(check_text)]
    """The rule's name, shown in its firings, events and webhooks."""
    when: When
    """What fires the rule, chosen by its ``kind``: ``event``, ``threshold``, ``deviation``,
    ``no_progress`` or ``early_stop``."""
    notify: Notify | None = None
    """A signed webhook for each firing; null: none (then ``stop`` must be set)."""
    stop: bool = False
    """Cancel the job (with a checkpoint) when the rule fires; ``early_stop`` always stops."""

    @model_validator(mode="after")
    def _acts(self) -> JobAlert:
        if self.notify is None and not self.stop and self.when.kind != "early_stop":
            raise ValueError("a rule needs an action: notify, stop, or both")
        return self

    @property
    def stops(self) -> bool:
        return self.stop or self.when.kind == "early_stop"


class RuleSpec(JobAlert):
    """``POST /alerts/rules``: a rule over the caller's jobs."""

    scope: Scope = Field(default_factory=Scope)
    """Which of the caller's jobs the rule watches: all of them by default."""


def finite_or_none(value: Any) -> float | None:
    """A recorded value as a float, or None when missing or not finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
