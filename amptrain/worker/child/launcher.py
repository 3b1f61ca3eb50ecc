"""The data-parallel launcher: PyTorch's own ``torch.distributed.run``, tied to its supervisor.

``python -m amptrain.worker.child.launcher SUPERVISOR_PID TORCHRUN_ARGS...`` sets a parent-death
signal (SIGKILL) and checks that its parent is still ``SUPERVISOR_PID`` (a death signal
set after the parent already died does nothing: :func:`amptrain.core.lifeline.die_with`),
then runs torchrun's ``main`` in this process. torchrun starts each rank in a new session, so a launcher killed with SIGKILL
would leave its ranks training unsupervised: each rank ties itself to this process the
same way (:func:`amptrain.worker.child.rank.die_with_launcher`), given its pid in
:data:`LAUNCHER_PID_ENV`.
"""

from __future__ import annotations

import os
import sys

from amptrain.core.lifeline import ORPHANED, die_with

LAUNCHER_PID_ENV = "AMPTRAIN_LAUNCHER_PID"
"""The launcher's pid, inherited by every rank (torchrun passes its environment on)."""


def main(argv: list[str]) -> int:
    if not die_with(int(argv[0])):
        return ORPHANED
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    from torch.distributed.run import main as torchrun  # torch: only after the check

    torchrun(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
