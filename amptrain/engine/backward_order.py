"""The order in which backward produces each parameter's gradient, recorded once a run.

Overflow attribution (:mod:`~amptrain.engine.attribution`) names, for a skipped fp16 step,
the first parameter in backward order whose gradient norm was inf/NaN: an inf or NaN born
in one layer's backward flows into every gradient autograd computes after it, so the first
non-finite one is where it started. The reverse of registration order
(``model.parameters()``) is not that order: a forward that calls its modules out of the
order they were registered in (a head registered before the stem, a branch defined after
the layers it feeds) produces their gradients in another order; a tied weight is
accumulated once, after its last use in backward, wherever it was registered; and even
within a layer the order is autograd's (on the CPU under fp16 autocast a Linear's weight
gradient is accumulated before its bias's).

So the real order is recorded, once: on the run's first backward, a
``register_post_accumulate_grad_hook`` on each trainable parameter notes it when autograd
has accumulated its gradient; when that backward returns the hooks are removed, and no
later step pays for them (with gradient accumulation, the first micro-batch's backward is
enough). A backward that raised (an OOM) records nothing, and the next one records afresh.
A model whose graph changes from step to step is attributed by its first step's order.
Parameters that got no gradient in that backward come after the recorded ones, in reverse
registration order (the only order known for them).

For the device, the order is a per-parameter *priority* (float32, the first gradient
produced has the highest): :func:`~amptrain.engine.attribution.first_nonfinite` takes the
highest priority among a step's non-finite norms, in the same few kernels for the whole
window, and :attr:`BackwardOrder.ranked` lists the names by priority, so a priority read
back at the flush indexes its name. A tensor is built once per set of parameters that had
gradients (all of them, on most models' every step), so a step adds no kernel and no copy.
"""

from __future__ import annotations

import torch


class BackwardOrder:
    """Records the backward order of ``params`` (named ``names``, in registration order) on
    the first backward run through :meth:`backward`."""

    def __init__(
        self, names: tuple[str, ...], params: list[torch.Tensor], device: torch.device
    ) -> None:
        self._names = names
        self._device = device
        self._seen: list[int] = []
        self._handles = [
            p.register_post_accumulate_grad_hook(lambda _, i=i: self._seen.append(i))
            for i, p in enumerate(params)
        ]
        self._ranked: tuple[str, ...] | None = None
        self._all: torch.Tensor | None = None  # every parameter's: most steps' (no hashing)
        # By the names of the parameters that had gradients, when some had none.
        self._priorities: dict[tuple[str, ...], torch.Tensor] = {}

    @property
    def recording(self) -> bool:
        """True until a backward has been recorded (the hooks are still on)."""
        return self._ranked is None

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, recording the order its gradients are produced in; the hooks
        go once it returns."""
        self._seen.clear()  # a previous backward that raised recorded part of one
        loss.backward()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._ranked = self._rank(self._seen)

    @property
    def ranked(self) -> tuple[str, ...]:
        """Every parameter's name, in ascending priority (the last is the first gradient
        backward produced): index ``k`` names the parameter of priority ``k``."""
        return self._ranked if self._ranked is not None else self._rank([])

    def priority(self, names: tuple[str, ...]) -> torch.Tensor:
        """Per parameter of ``names`` (those that had gradients, in registration order), its
        priority: 1-D float32 on the device, built once per tuple of names."""
        if names is self._names and self._all is not None:
            return self._all
        found = self._priorities.get(names)
        if found is None:
            rank = {n: k for k, n in enumerate(self.ranked)}
            found = torch.tensor([float(rank[n]) for n in names])
            if self._device.type == "cuda":  # from pinned memory: a copy the host does not wait for
                found = found.pin_memory().to(self._device, non_blocking=True)
            found = found.to(self._device)
            if self._ranked is None:  # before any backward: the proxy's, not kept
                return found
            self._priorities[names] = found
            if names is self._names:
                self._all = found
        return found

    def _rank(self, seen: list[int]) -> tuple[str, ...]:
        # Backward order: as produced (a parameter noted twice, e.g. by a reentrant
        # checkpoint's second backward, counts where it came first), then the rest.
        first = list(dict.fromkeys(seen))
        noted = set(first)
        backward = first + [i for i in reversed(range(len(self._names))) if i not in noted]
        return tuple(self._names[i] for i in reversed(backward))
