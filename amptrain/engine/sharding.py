"""How a run holds its model across its devices: DDP copies or FSDP2 shards, and activation
checkpointing (spec fields ``parallelism`` and ``activation_checkpointing``).

Both act per *block*: the repeated modules a model is made of (:func:`blocks`, the one place
that knows each model family's). With ``fsdp`` each block is a unit of PyTorch's
``fully_shard`` (its parameters gathered just before its forward and backward, and freed
after), then the root takes the rest; the sharded parameters are fp32 ``DTensor``s, the
master weights the optimizer steps. The mixed-precision policy comes from the job's
precision (:func:`mixed_precision`): bf16/fp16 gather the weights in that dtype and reduce
gradients in fp32.

Autocast stays on under that policy, as with ddp. With the weights already gathered in the
low dtype, autocast's casts of them to that dtype are no-ops (no second rounding), while it
still runs the ops it keeps in fp32 (softmax, norms, the loss: ``fp32_island``) in fp32, as
the ddp path does; torchtitan drops autocast with FSDP2 because its models do their own fp32
islands, which amptrain's models (and the field's libraries) do not promise.

fp16's loss scaling needs nothing sharded of its own: in torch 2.14 the GradScaler's
inf/NaN check on ``DTensor`` gradients (``_amp_foreach_non_finite_check_and_unscale_``)
already reduces its flag by MAX over the shards (``found_inf_reduce_handler`` in
``torch.distributed.tensor._dispatch``), so every rank skips the same steps and keeps the
same scale. The per-parameter norms of sharded gradients are ``DTensor``s whose
``full_tensor()`` is the whole gradient's norm (see ``amp_step``).

Checkpoints of a sharded run keep the model and the optimizer as a Distributed Checkpoint
(:class:`Sharding.save` / :meth:`Sharding.load`), every rank writing its own shards; the
rest of the run state takes the ordinary path (``checkpoint_manager``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from amptrain.contract.spec import JobSpec
from amptrain.engine.distributed import Group

LOW_PRECISION_PARAMS = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The dtype FSDP gathers weights in, by effective precision; fp32/tf32 gather fp32."""


def mixed_precision(precision: str) -> Any:
    """FSDP2's policy for a job trained in ``precision``: weights gathered in the low dtype,
    gradients reduced in fp32 onto fp32 shards (the master weights the optimizer steps)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=LOW_PRECISION_PARAMS.get(precision), reduce_dtype=torch.float32
    )


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, outermost first, in registration order; empty when it has
    none (then the root is the only unit).

    - a Hugging Face model names its own (``_no_split_modules``, the classes its layers are
      built of: what accelerate's FSDP wrapping uses);
    - amptrain's MLP: its hidden Linear layers (its head stays with the root);
    - anything else: the members of every ``nn.Sequential``/``nn.ModuleList`` made of two or
      more modules of one class that hold parameters: the built-in transformer's and cnn's
      blocks, torchvision's and timm's ResNet blocks and ViT encoder layers.
    """
    from amptrain.components.models import MLP

    if isinstance(model, MLP):
        linears: list[nn.Module] = [m for m in model.net if isinstance(m, nn.Linear)]
        return linears[:-1]
    named = getattr(model, "_no_split_modules", None)
    if named:
        found = [m for m in model.modules() if m is not model and type(m).__name__ in named]
        if found:
            return found
    return list(_repeated(model))


def _repeated(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        members = list(child.children())
        if (
            isinstance(child, (nn.Sequential, nn.ModuleList))
            and len(members) >= 2
            and len({type(m) for m in members}) == 1
            and any(True for _ in members[0].parameters())
        ):
            yield from members
        else:
            yield from _repeated(child)


class Sharding:
    """How this rank holds the model (``wrap``) and, when sharded, how its model and optimizer
    state reach a checkpoint (``save``/``load``/``export``)."""

    def __init__(self, spec: JobSpec, group: Group, precision: str) -> None:
        self.group = group
        self.precision = precision
        self.checkpointing = spec.activation_checkpointing
        self.sharded = group.parallel and spec.parallelism == "fsdp"
        self._model: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model as training calls it: blocks checkpointed if asked, then sharded in
        place (FSDP2: the module itself, its parameters now ``DTensor`` shards) or wrapped in
        DDP (see :meth:`Group.wrap`). The optimizer must be built on its parameters after."""
        if self.checkpointing:
            # The composable form keeps every parameter's name (a checkpoint_wrapper module
            # would add a prefix): checkpoints, exported weights and telemetry stay as they are.
            from torch.distributed._composable import checkpoint

            for block in blocks(model):
                checkpoint(block, use_reentrant=False)
        if not self.sharded:
            return self.group.wrap(model)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.group.device.type, (self.group.world_size,))
        policy = mixed_precision(self.precision)
        for block in blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        self._model = model
        return model

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer built on the sharded parameters (its state is sharded alike)."""
        self._optimizer = optimizer

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        assert self._model is not None and self._optimizer is not None
        model, optimizer = get_state_dict(self._model, self._optimizer)
        return {"model": model, "optimizer": optimizer}

    def save(self, path: str) -> None:
        """Every rank writes its shards of the model and optimizer under ``path`` (a
        collective: all ranks call it)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=path)

    def load(self, path: str) -> None:
        """Inverse of :meth:`save`: each rank reads its own shards (same world size)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        assert self._model is not None and self._optimizer is not None
        state = self._state()
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            self._model,
            self._optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    def export(self) -> bytes | None:
        """The whole model's weights as safetensors on the leader (None on the others); a
        collective: the shards are gathered onto the leader's CPU."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        assert self._model is not None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self._model, options=options)
        if not self.group.leader:
            return None
        from amptrain.engine.initial_weights import export_bytes  # it imports the manager

        return export_bytes(self._model, state)


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds of the training state: its parameters, gradients and optimizer
    state (their local shards when sharded, full copies with ddp)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        to_local = getattr(t, "to_local", None)
        return to_local() if to_local is not None else t

    tensors = [local(p) for p in model.parameters()]
    tensors += [local(p.grad) for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [local(v) for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)
