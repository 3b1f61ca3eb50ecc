"""What a checkpoint holds (:class:`RunState`) and which checkpoints there are
(:class:`CheckpointManager`): one place saves, prunes and finds them.

The manager keeps an index of the job's checkpoints, read once from their sidecars
(:class:`~amptrain.engine.checkpoint.CheckpointMeta`) and updated by every save and removal,
on every rank alike. Resume, a precision fallback and a spike rollback all go back through
the one lookup, :meth:`CheckpointManager.find`; whether a checkpoint is healthy is known
without loading it. Pruning keeps the newest ``keep_last`` and, whatever came after it in this
attempt or an earlier one, the newest healthy checkpoint: what a fallback resumes from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from amptrain.contract.layout import checkpoint_name
from amptrain.engine.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointMeta,
    CheckpointStore,
    capture_rng,
    check_resumable,
    restore_rng,
)
from amptrain.engine.distributed import Group
from amptrain.engine.sharding import Sharding
from amptrain.engine.train_state import TrainState


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


LEARNED = ("model", "optimizer", "scheduler", "scaler", "spike")
"""The components' states: what a spike rollback takes back from an older checkpoint (the
:class:`~amptrain.engine.train_state.TrainState` and the RNG streams stay as they are)."""


class RunState:
    """Everything exact resume needs: the loop's :class:`TrainState`, each component's
    state (:data:`LEARNED`; None for one the run does not have) and every RNG stream, as
    tensors and plain types (``weights_only``-loadable)."""

    def __init__(
        self,
        train: TrainState,
        components: Mapping[str, Stateful | None],
        group: Group,
        device: torch.device,
        attempt: int,
        parallelism: str = "ddp",
    ) -> None:
        """``parallelism`` ``fsdp``: ``model`` and ``optimizer`` are None here, their sharded
        states going through the manager's :class:`~amptrain.engine.sharding.Sharding`."""
        assert set(components) == set(LEARNED), sorted(components)
        self.train = train
        self.parallelism = parallelism
        self._components = components
        self._group = group
        self._attempt = attempt
        # The one GPU whose RNG a data-parallel rank checkpoints (None: every initialised one).
        self._cuda = device if group.parallel and device.type == "cuda" else None

    def state_dict(self, *, healthy: bool) -> dict[str, Any]:
        """A checkpoint's contents (``healthy``: the guardian's mark). Devices > 1: a
        collective (it gathers every rank's RNG states); call it on all ranks."""
        rngs = self._group.gather_objects(capture_rng(self._cuda))
        parallel = {"rng_per_rank": rngs} if self._group.parallel else {}
        parts = {
            n: (c.state_dict() if c is not None else None) for n, c in self._components.items()
        }
        return {
            "format": CHECKPOINT_FORMAT,
            **self.train.state_dict(),
            **parts,
            "rng": rngs[0],
            "world_size": self._group.world_size,
            "parallelism": self.parallelism,
            "attempt": self._attempt,
            "healthy": healthy,
            **parallel,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: every part as it was; the run continues exactly where it was."""
        check_resumable(state, self._group.world_size, self.parallelism)
        self.load_learned(state)
        self.train.load_state_dict(state)
        rng = state["rng_per_rank"][self._group.rank] if self._group.parallel else state["rng"]
        restore_rng(rng, self._cuda)

    def load_fork(self, state: dict[str, Any]) -> bool:
        """A fork's start (:mod:`~amptrain.engine.forks`): every part as a resume loads it,
        except that the optimizer keeps this run's hyper-parameters (lr, betas, weight
        decay...) over the loaded state, and starts with fresh state when the checkpoint's
        is another kind's (its parameter groups' options differ). Whether it was kept."""
        check_resumable(state, self._group.world_size, self.parallelism)
        kept = True
        for name, component in self._components.items():
            if component is None or not state.get(name):
                continue
            if isinstance(component, _Optimizer):
                kept = component.load_keeping_options(state[name])
            else:
                component.load_state_dict(state[name])
        self.train.load_state_dict(state)
        rng = state["rng_per_rank"][self._group.rank] if self._group.parallel else state["rng"]
        restore_rng(rng, self._cuda)
        return kept

    def load_learned(self, state: dict[str, Any]) -> None:
        """A rollback: the components' states only (see :data:`LEARNED`)."""
        check_resumable(state, self._group.world_size, self.parallelism)
        for name, component in self._components.items():
            if component is not None and state.get(name):  # the scaler's is {} when disabled
                component.load_state_dict(state[name])


class CheckpointManager:
    """One job's checkpoints: save (the leader writes), prune (never a checkpoint a fork pinned), find, load, discard."""

    def __init__(
        self,
        store: CheckpointStore | None,
        keep_last: int,
        every_steps: int,
        group: Group,
        export: Callable[[], bytes] | None = None,
    ) -> None:
        """``export``: the model's weights as a safetensors file, written beside each
        checkpoint (by the leader, the one writer)."""
        self.shards: Sharding | None = None
        """Set for a sharded run (fsdp): its model and optimizer are saved and loaded as a
        Distributed Checkpoint beside each checkpoint file, by every rank."""
        self._store = store
        self._export = export
        self._keep_last = keep_last
        self._every = every_steps
        self._group = group
        self._index: dict[int, CheckpointMeta] = (
            {step: store.meta(step) for step in store.steps()} if store is not None else {}
        )
        self._loaded: tuple[int, dict[str, Any]] | None = None
        self.last_saved: int | None = None
        """The step of the newest checkpoint this attempt wrote or resumed from."""

    @property
    def enabled(self) -> bool:
        """Whether the run has a checkpoint directory."""
        return self._store is not None

    def due(self, step: int, *, final: bool) -> bool:
        """Whether to write a checkpoint after ``step`` (``final``: the run's last): every
        ``every_steps`` and at the end, unless this step's exists (a rollback wrote it)."""
        due = final or step % self._every == 0
        return due and self.enabled and self.last_saved != step

    def resume(self, run: RunState, recorded: Mapping[int, int] | None) -> int | None:
        """Load into ``run`` the newest checkpoint whose lineage is recorded (see
        ``RunContext.recorded``; the leader decides for every rank) and, under ``recorded``,
        remove the ones after it (never resumed from, so never kept either); its step, or
        None when there is none."""
        if not self.enabled:
            return None
        found = self.find(recorded=recorded) if self._group.leader else None
        step = self._group.leader_value(found)
        if recorded is not None:
            self.discard_after(step or 0)
        if step is not None:
            run.load_state_dict(self.load(step))  # refuses another world size first
            if self.shards is not None and self._store is not None:
                self.shards.load(self._store.shards(step))
            self.last_saved = run.train.resumed_from = step
        return step

    def newest_healthy(self, step: int) -> int | None:
        """What a fallback and a rollback go back to: :meth:`find` of a healthy one."""
        return self.find(upto=step, healthy=True)

    def steps(self) -> list[int]:
        """The checkpoints there are, oldest first."""
        return sorted(self._index)

    def find(
        self,
        *,
        upto: int | None = None,
        healthy: bool = False,
        recorded: Mapping[int, int] | None = None,
    ) -> int | None:
        """The newest checkpoint at or before ``upto``, only healthy ones with ``healthy``
        (a fallback and a rollback), and under ``recorded`` only one whose writing attempt
        has recorded through its step (a resume: see ``RunContext.recorded``); None: none."""
        for step in sorted(self._index, reverse=True):
            meta = self._index[step]
            if upto is not None and step > upto:
                continue
            if healthy and not meta.healthy:
                continue
            if recorded is not None and step > recorded.get(meta.attempt, 0):
                continue
            return step
        return None

    def load(self, step: int) -> dict[str, Any]:
        """The checkpoint of ``step`` (read once when asked for twice in a row)."""
        assert self._store is not None
        if self._loaded is not None and self._loaded[0] == step:
            return self._loaded[1]
        state = self._store.load(self._store.path(checkpoint_name(step)))
        self._loaded = (step, state)
        return state

    def save(self, state: dict[str, Any]) -> str | None:
        """Write ``state`` (a :meth:`RunState.state_dict`) as the checkpoint of its step, the
        model's weights exported beside it, and prune. Devices > 1: every rank calls it; rank 0 writes, no rank goes on before the
        checkpoint exists (fsdp: every rank writes its shards first)."""
        assert self._store is not None
        meta = CheckpointMeta(int(state["step"]), bool(state["healthy"]), int(state["attempt"]))
        path = None
        weights = None
        if self.shards is not None:
            # Every rank writes its shards, then the leader renames them into place: before
            # the checkpoint file, so one never exists without its shards.
            self.shards.save(self._store.shards_temporary(meta.step))
            self._group.barrier()
            if self._group.leader:
                self._store.publish_shards(meta.step)
            weights = self.shards.export()  # a gather: every rank takes part
        elif self._group.leader and self._export is not None:
            weights = self._export()
        if self._group.leader:
            path = self._store.save(meta.step, state, meta, weights)
        self._index[meta.step] = meta
        self._loaded = None
        self._prune()
        self._group.barrier()
        self.last_saved = meta.step
        return path

    def discard_after(self, step: int) -> None:
        """Remove the checkpoints after ``step``: a resume or a fallback goes back to it, and
        what came after is never resumed from, so never kept either."""
        for later in [s for s in self._index if s > step]:
            self._remove(later)
        self._group.barrier()  # no rank's next attempt starts before they are gone

    def _prune(self) -> None:
        keep = set(self.steps()[-self._keep_last :])
        newest_healthy = self.find(healthy=True)
        if newest_healthy is not None:
            keep.add(newest_healthy)
        doomed = [s for s in self._index if s not in keep]
        if doomed and self._store is not None:
            # A fork waiting to start from one of them pinned it (the API pins it before it
            # checks it exists): the fork's first state must still be there when it starts.
            # Read now, not indexed: pins come and go while this job trains. The leader reads
            # for every rank, so their indexes agree; a kept one is pruned once unpinned.
            seen = sorted(self._store.pinned()) if self._group.leader else None
            pinned = set(self._group.leader_value(seen) or ())
            doomed = [s for s in doomed if s not in pinned]
        for step in doomed:
            self._remove(step)

    def _remove(self, step: int) -> None:
        del self._index[step]
        if self._store is not None and self._group.leader:
            self._store.remove(step)


def learned_parts(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Stateful,
    scaler: torch.amp.GradScaler | None,
    spike: Stateful | None,
) -> dict[str, Stateful | None]:
    """The components' states by their :data:`LEARNED` names."""
    return {
        "model": model,
        "optimizer": _Optimizer(optimizer),
        "scheduler": schedule,
        "scaler": scaler,
        "spike": spike,
    }


class _Optimizer:
    """An optimizer whose loaded state keeps the kernel this engine built it with: its
    ``load_state_dict`` copies every saved group option over the built ones, so a checkpoint
    written by an older engine (or another device) could turn ``fused`` off."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state)
        for group in self._optimizer.param_groups:
            for key in ("fused", "foreach"):
                if key in self._optimizer.defaults:
                    group[key] = self._optimizer.defaults[key]

    def load_keeping_options(self, state: dict[str, Any]) -> bool:
        """Load the state (moments, step counts) and keep every built group option (a
        fork's hyper-parameters); False, loading nothing, when the state is another kind
        of optimizer's (its groups hold other options)."""
        groups = self._optimizer.param_groups
        saved = state.get("param_groups") or []
        if len(saved) != len(groups) or any(
            set(old) != set(new) for old, new in zip(saved, groups, strict=True)
        ):
            return False
        options = [{k: v for k, v in g.items() if k != "params"} for g in groups]
        self._optimizer.load_state_dict(state)
        for group, own in zip(self._optimizer.param_groups, options, strict=True):
            group.update(own)
        return True
