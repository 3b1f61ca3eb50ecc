"""``precision: auto`` by measurement: a few training steps of the job's own model.

A rule read from CPU flags or a GPU's capability cannot know the model: on an AMX CPU
the rule chose bf16 for a small MLP that then trained at 0.54x fp32's throughput (and
here, an AVX2 CPU, bf16 ran the default mlp at ~0.45x). So before training the engine
times forward + backward of a throwaway copy of the model on one real micro-batch (the
dataset's first; samples are pure functions of their index, so reading it moves nothing)
in each candidate precision, interleaved, the fastest step of each (on a shared machine
other work only ever adds time to a step, so the minimum is the least noisy estimate; the
median flipped a width-8 mlp between 0.9x and 1.8x under load here):

- CUDA capability >= 8.0: bf16 against tf32 (the fair baseline: what fp32 users get);
- CUDA 7.x: fp16 against fp32 (no TF32 there); below 7.0 there is nothing to measure;
- CPU: bf16 against fp32 (fp16 never: no CPU runs it natively).

The low precision wins only when it is at least :data:`MIN_SPEEDUP` faster and its loss
stayed finite in every timed step; a tie goes to the baseline, which is the numerically
safer one. The cost is bounded by ``budget_s`` (:data:`WARMUP_PAIRS` untimed pairs, then
timed pairs until ``steps`` pairs or the budget is spent; at least one), and reported. Nothing the run keeps is touched:
the copy's gradients are thrown away with it, no optimizer steps, and every RNG is forked
(:func:`torch.random.fork_rng`), so the job's seed still decides everything and resume
stays exact.

The decision is cached per (model name and arguments, input shape, micro-batch size,
device, threads) in a mapping the caller hands over (the worker: a file that outlives its
one-attempt training processes; otherwise this process's dict), so a worker decides a
model alike for every job. A resumed attempt never measures: it takes the precision its
checkpoint recorded (see :func:`amptrain.engine.parts.build_parts`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from amptrain.engine.precision import AUTOCAST_DTYPES, PrecisionChoice, fp32_island

MIN_SPEEDUP = 1.1
"""The low precision must measure at least this much faster than the baseline: smaller
gaps are within run-to-run noise on a shared machine, and the baseline is the safer one."""

DEFAULT_STEPS = 10
"""Timed steps per precision at most (the budget usually stops it sooner on big models)."""
DEFAULT_BUDGET_S = 2.0
"""Wall time after which no further timed pair starts (warm-up included; at least one)."""
WARMUP_PAIRS = 2
"""Untimed pairs first: a fresh process's first steps ran 10-100x slower here (lazy kernel
and allocator set-up), and a GPU's first ones autotune cuDNN."""

PROCESS_CACHE: dict[str, dict[str, Any]] = {}
"""This process's decisions, for callers that hand no cache of their own."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Measurement:
    """What the probe found: the fastest step time (ms) of each precision and the decision."""

    baseline: str
    candidate: str
    baseline_ms: float
    candidate_ms: float
    steps: int
    """Timed steps per precision."""
    seconds: float
    """Wall time the whole probe took, warm-up included."""
    candidate_finite: bool
    effective: str

    @property
    def ratio(self) -> float:
        """Throughput of the candidate relative to the baseline (> 1: candidate faster)."""
        return self.baseline_ms / self.candidate_ms

    def describe(self) -> str:
        """E.g. ``bf16 0.54x fp32 measured over 5 steps in 0.91 s: fp32``."""
        text = (
            f"{self.candidate} {self.ratio:.2f}x {self.baseline} measured over {self.steps} "
            f"steps in {self.seconds:.2f} s"
        )
        if not self.candidate_finite:
            text += f" ({self.candidate} loss not finite)"
        elif self.effective == self.baseline and self.ratio >= 1.0:
            text += f" (below the {MIN_SPEEDUP}x it must gain)"
        return f"{text}: {self.effective}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "baseline_ms": round(self.baseline_ms, 3),
            "candidate_ms": round(self.candidate_ms, 3),
            "ratio": round(self.ratio, 3),
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "candidate_finite": self.candidate_finite,
            "effective": self.effective,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(
            baseline=str(data["baseline"]),
            candidate=str(data["candidate"]),
            baseline_ms=float(data["baseline_ms"]),
            candidate_ms=float(data["candidate_ms"]),
            steps=int(data["steps"]),
            seconds=float(data["seconds"]),
            candidate_finite=bool(data["candidate_finite"]),
            effective=str(data["effective"]),
        )


def candidates(device: torch.device) -> tuple[str, str] | None:
    """(baseline, low precision) to measure on ``device``; None: nothing to measure."""
    if device.type == "cpu":
        return "fp32", "bf16"
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        if major >= 8:
            return "tf32", "bf16"
        if major == 7:
            return "fp32", "fp16"
    return None


def cache_key(model: dict[str, Any], inputs: torch.Tensor, device: str) -> str:
    """One decision per model (name and arguments), input shape and dtype, micro-batch size
    (the first dimension of ``inputs``), device (its description names the GPU model and
    capability) and thread count (a CPU's throughput depends on it)."""
    return json.dumps(
        {
            "model": model,
            "inputs": [list(inputs.shape), str(inputs.dtype)],
            "device": device,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        sort_keys=True,
        default=str,
    )


def measure(
    model: torch.nn.Module,
    loss_fn: LossFn,
    batch: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
    pair: tuple[str, str],
    *,
    steps: int = DEFAULT_STEPS,
    budget_s: float = DEFAULT_BUDGET_S,
) -> Measurement:
    """Time ``pair`` (baseline, candidate) on a deep copy of ``model``; raises whatever the
    copy or a step raises (the caller falls back to the capability rule)."""
    started = time.perf_counter()
    baseline, candidate = pair
    forked = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        probe = copy.deepcopy(model).train()
        inputs, targets = (t.to(device) for t in batch)
        losses: list[torch.Tensor] = []

        def step(precision: str) -> float:
            t0 = _now(device)
            loss = _step(probe, loss_fn, inputs, targets, device, precision)
            elapsed = _now(device) - t0
            if precision == candidate:
                losses.append(loss)
            return elapsed

        for _ in range(WARMUP_PAIRS):
            step(baseline), step(candidate)
        times: dict[str, list[float]] = {baseline: [], candidate: []}
        deadline = started + budget_s
        while len(times[candidate]) < steps and (
            not times[candidate] or time.perf_counter() < deadline
        ):
            for precision in pair:
                times[precision].append(step(precision))
        finite = bool(torch.isfinite(torch.stack(losses)).all())  # one host read, at the end
    base_ms = min(times[baseline]) * 1e3
    cand_ms = min(times[candidate]) * 1e3
    wins = finite and base_ms / cand_ms >= MIN_SPEEDUP
    return Measurement(
        baseline=baseline,
        candidate=candidate,
        baseline_ms=base_ms,
        candidate_ms=cand_ms,
        steps=len(times[candidate]),
        seconds=time.perf_counter() - started,
        candidate_finite=finite,
        effective=candidate if wins else baseline,
    )


def decide(
    rule: PrecisionChoice,
    model: torch.nn.Module,
    loss_fn: LossFn,
    batch: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
    *,
    model_ref: dict[str, Any],
    cache: MutableMapping[str, dict[str, Any]] | None = None,
    steps: int = DEFAULT_STEPS,
    budget_s: float = DEFAULT_BUDGET_S,
) -> PrecisionChoice:
    """``auto``'s choice for this model: cached, else measured; ``rule`` (the capability
    rule's choice) when there is nothing to measure or the probe fails."""
    pair = candidates(device)
    if pair is None:
        return rule
    cache = PROCESS_CACHE if cache is None else cache
    key = cache_key(model_ref, batch[0], rule.device)
    cached = _cached(cache, key)
    if cached is not None:
        return _choice(rule, cached, "measured earlier on this worker, cached")
    try:
        found = measure(model, loss_fn, batch, device, pair, steps=steps, budget_s=budget_s)
    except Exception as exc:  # an OOM, a model that cannot be copied: the rule decides
        reason = f"{rule.reason} (the measurement could not run: {type(exc).__name__})"
        return PrecisionChoice(rule.requested, rule.effective, reason, rule.device)
    finally:
        if device.type == "cuda":
            # Here the copy and a failed probe's frames are gone: hand their blocks back,
            # and let the job's memory_peak (allocated_bytes.all.peak) and the OOM messages
            # that quote it show training's peak, not the probe's.
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    with contextlib.suppress(Exception):  # a cache that cannot be written costs a re-measure
        cache[key] = found.to_dict()
    return _choice(rule, found.to_dict(), None)


def _cached(cache: MutableMapping[str, dict[str, Any]], key: str) -> dict[str, Any] | None:
    try:
        data = cache.get(key)
        if data is not None:
            Measurement.from_dict(data)  # a malformed entry is measured again
        return data
    except Exception:
        return None


def _choice(rule: PrecisionChoice, data: dict[str, Any], note: str | None) -> PrecisionChoice:
    found = Measurement.from_dict(data)
    reason = found.describe() + (f" ({note})" if note else "")
    return PrecisionChoice(
        rule.requested,
        found.effective,  # type: ignore[arg-type]
        reason,
        rule.device,
        measurement={**found.to_dict(), "cached": note is not None},
    )


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # time the kernels, not their launch
    return time.perf_counter()


def _step(
    model: torch.nn.Module,
    loss_fn: LossFn,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    device: torch.device,
    precision: str,
) -> torch.Tensor:
    """Forward + loss + backward as the AMP step runs them; returns the detached loss."""
    model.zero_grad(set_to_none=True)
    dtype = AUTOCAST_DTYPES[precision]
    with torch.autocast(
        device.type,
        dtype=dtype or torch.get_autocast_dtype(device.type),
        enabled=dtype is not None,
    ):
        logits = model(inputs)
        with fp32_island():
            loss = loss_fn(logits.float(), targets)
    loss.backward()
    return loss.detach()
