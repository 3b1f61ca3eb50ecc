"""What a service refuses at submit time beyond the spec's own bounds (torch-free).

The spec's fields and the catalog's argument bounds are the same on every service;
these checks depend on how a service is set up (:class:`ServicePolicy`, built by
the API from its settings): which files a user may read, how much memory one job
may need, how long one attempt may run. Each refusal is a problem dict naming the
field, like :func:`amptrain.contract.catalog.validate_components`; the worker
repeats what it can check better itself (files, its own device memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from amptrain.contract import catalog, sizing
from amptrain.contract.data_access import PathRefused, check_location, user_roots
from amptrain.contract.spec import JobSpec
from amptrain.contract.text import quote
from amptrain.contract.weights import check_weights_path


@dataclass(frozen=True)
class WorkerMemory:
    """What a training process could get on one live worker (as it last measured while it
    ran no job), and whether the worker has a GPU (then the model lives there)."""

    available_bytes: int
    gpu: bool


@dataclass(frozen=True)
class ServicePolicy:
    data_roots: Sequence[str] = ()
    data_protocols: Sequence[str] = ("file",)
    data_roots_per_user: bool = False
    """Also makes weights roots per user."""
    weights_roots: Sequence[str] = ()
    """Local directories a spec's ``weights.path`` may read (none: no weights files)."""
    max_job_memory_bytes: int | None = None
    """Refuse specs whose memory lower bound (``sizing.SpecSize``) exceeds this."""
    runtime_limit_s: float | None = None
    """Largest ``max_runtime_s`` a spec may ask for."""
    workers: Sequence[WorkerMemory] = ()
    """The live workers of the job's queue that report their memory: a spec whose host
    memory fits none of them is refused (none known: the worker checks before allocating)."""
    max_nodes: int | None = None
    """Most ``nodes`` a spec may ask for (the service's ``AMPTRAIN_MAX_NODES``)."""


def spec_size(spec: JobSpec) -> sizing.SpecSize | None:
    """The memory a spec needs at least, when its model and dataset declare their sizes.

    None when the dataset's shape is unknown before it is read (files, most plugins).
    Call it on a spec whose components validated.
    """
    model = catalog.builtins("model").get(spec.model.name)
    data = catalog.builtins("dataset").get(spec.dataset.name)
    if data is None or data.footprint is None:
        return None
    shape = data.footprint(data.with_defaults(spec.dataset.args))
    if shape is None:
        return None
    parameters = None
    if model is not None and model.parameters is not None:
        parameters = model.parameters(shape, model.with_defaults(spec.model.args))
    state = (
        sizing.training_state_bytes(parameters, spec.optimizer.name, spec.optimizer.momentum)
        if parameters is not None
        else 0
    )
    state = sizing.per_device_state_bytes(state, spec.devices, spec.parallelism)
    return sizing.SpecSize(parameters, state, shape.resident_bytes)


def admission_problems(spec: JobSpec, owner: str, policy: ServicePolicy) -> list[dict[str, Any]]:
    """``[{"loc": [...], "msg": ...}]`` for what this service refuses; empty = admitted."""
    problems = _path_problems(spec, owner, policy)
    if policy.max_nodes is not None and spec.nodes > policy.max_nodes:
        problems.append(
            {
                "loc": ["nodes"],
                "msg": f"at most {policy.max_nodes} nodes on this service; got {spec.nodes}",
            }
        )
    limit = policy.runtime_limit_s
    if spec.max_runtime_s is not None and limit is not None and spec.max_runtime_s > limit:
        problems.append(
            {
                "loc": ["max_runtime_s"],
                "msg": f"at most {limit:g} seconds on this service; got {spec.max_runtime_s}",
            }
        )
    if (policy.max_job_memory_bytes is not None or policy.workers) and not (
        catalog.validate_components(spec)
    ):
        size = spec_size(spec)
        problem = _memory_problem(spec, size, policy) if size is not None else None
        if problem is not None:
            problems.append(problem)
    return problems


def _memory_problem(
    spec: JobSpec, size: sizing.SpecSize, policy: ServicePolicy
) -> dict[str, Any] | None:
    field = ["model" if size.state_bytes >= size.data_bytes else "dataset", "args"]
    limit = policy.max_job_memory_bytes
    if limit is not None and size.total > limit:
        return {
            "loc": field,
            "msg": f"too large: {size.describe()}, more than the "
            f"{sizing.format_bytes(limit)} one job may use on this service",
            "type": "too_large",
        }
    if not policy.workers:
        return None
    # Every data-parallel process holds the dataset; the model is in host memory on a CPU.
    needs = {
        gpu: spec.devices
        * (size.data_bytes + (0 if gpu and spec.device != "cpu" else size.state_bytes))
        for gpu in (False, True)
    }
    if any(needs[w.gpu] <= w.available_bytes for w in policy.workers):
        return None
    need = min(needs[w.gpu] for w in policy.workers)
    most = max(w.available_bytes for w in policy.workers)
    per = f" ({spec.devices} processes)" if spec.devices > 1 else ""
    return {
        "loc": field,
        "msg": f"too large: the job needs about {sizing.format_bytes(need)} of host memory"
        f"{per} ({size.describe()}), but the workers of its queue have at most "
        f"{sizing.format_bytes(most)} available to a training process",
        "type": "too_large",
    }


def _path_problems(spec: JobSpec, owner: str, policy: ServicePolicy) -> list[dict[str, Any]]:
    """Every path argument of a built-in dataset (``Arg.path``), checked as text against the
    owner's data roots; the worker checks again as it opens (plugins check their own)."""
    problems = _weights_problems(spec, owner, policy)
    data = catalog.builtins("dataset").get(spec.dataset.name)
    if data is None:
        return problems
    roots = user_roots(policy.data_roots, owner, policy.data_roots_per_user)
    for arg in data.path_args:
        path = spec.dataset.args.get(arg)
        if not isinstance(path, str) or not path:
            continue
        try:
            check_location(path, roots, policy.data_protocols, resolve=False)
        except PathRefused as exc:
            problems.append({"loc": ["dataset", "args", arg], "msg": f"{quote(path, 120)}: {exc}"})
    return problems


def _weights_problems(spec: JobSpec, owner: str, policy: ServicePolicy) -> list[dict[str, Any]]:
    if spec.weights is None:
        return []
    path = spec.weights.path
    try:
        roots = user_roots(policy.weights_roots, owner, policy.data_roots_per_user)
        check_weights_path(path, roots)
    except PathRefused as exc:
        return [{"loc": ["weights", "path"], "msg": f"{quote(path, 120)}: {exc}"}]
    return []
