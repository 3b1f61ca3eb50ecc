"""A data-parallel attempt (``devices`` > 1): torchrun's ranks, seen as one training process.

:class:`RankGroup` starts ``python -m amptrain.worker.child.launcher`` (PyTorch's
``torch.distributed.run --standalone --nnodes 1 --nproc-per-node K --max-restarts 0``,
which picks a free rendezvous port per job) with ``K`` ranks of
:mod:`amptrain.worker.child.rank`, and gives :class:`~amptrain.worker.pool.watch.AttemptWatch` the same
handle a single training child gives: rank 0's control messages, stop signals, kill.
Everything travels through the attempt's private :class:`~amptrain.worker.child.run_dir.RunDir`.

Failure rules (the launcher never restarts a rank; retries are amptrain attempts):

- the attempt ends when the launcher exits; its outcome is every rank's result, an error
  that is not ``internal`` preferred (a peer's broken collective usually is ``internal``),
  and "ended without a result" for a rank that left none (killed, crashed);
- a rank that reported a failure while its peers linger (a hung rank ignores torchrun's
  SIGTERM for 30 s) gets the others killed after :data:`FAILED_GRACE_S`, and the launcher
  too if it still tears down another grace later;
- no orphans: the launcher dies with this process and every rank with the launcher
  (parent-death signals), and a lost lease or a kill ends the launcher and every rank
  still alive, by pid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amptrain.worker.child.protocol import (
    Accepted,
    ControlMessage,
    Failed,
    Finished,
    Launch,
    ProtocolError,
    decode,
)
from amptrain.worker.child.run_dir import RunDir
from amptrain.worker.pool.child_handle import ChildProcess, child_env
from amptrain.worker.pool.slot import PoolSlot

log = logging.getLogger(__name__)

FAILED_GRACE_S = 3.0
"""How long the other ranks may outlive a rank that reported a failure."""

STOPPED = frozenset({"cancelled", "preempted"})
"""Error codes of ranks that stopped on request (checkpointed): not failures."""

MONITOR_INTERVAL_S = 0.2  # torchrun's poll of its ranks: a dead rank ends the attempt fast


def devices_of(launch: Launch) -> int:
    """The data-parallel process count the job asks for (1: the single-process path)."""
    value = launch.spec.get("devices", 1)
    return value if isinstance(value, int) and value > 1 else 1


def slot_gpus(pool_slot: PoolSlot) -> str | None:
    """The slot's GPUs (``--devices-per-job``) as ``CUDA_VISIBLE_DEVICES`` wants them; None:
    the worker sees no GPU (the ranks train on the CPU, gloo)."""
    return ",".join(pool_slot.gpus) if pool_slot.gpus else None


@dataclass(frozen=True)
class NodeArgs:
    """This node's part of a multi-node attempt: how many nodes, where they rendezvous."""

    nodes: int
    endpoint: str
    """``HOST:PORT`` of the c10d rendezvous, on the first node (the leader)."""
    rdzv_id: str
    """``JOB-ATTEMPT``: agents of another attempt never join this one's rendezvous."""
    local_addr: str
    """This node's address as the others reach it (``AMPTRAIN_NODE_ADDRESS``)."""
    join_timeout_s: int
    """How long the rendezvous waits for every node (they were reserved before)."""
    is_host: bool = False
    """This node hosts the rendezvous's store (the leader). Said, not guessed: torch's
    guess matches the endpoint against this machine's names and addresses, which any
    loopback endpoint, or an alias of the leader's address, gets wrong."""


def rendezvous_timeout(spec: dict[str, Any]) -> int:
    """How long a node's launcher waits for the others at the rendezvous: the job's
    collective timeout (the nodes were reserved first), at least 30 s (torch's imports)."""
    value = spec.get("collective_timeout_s", 600)
    return max(30, value if isinstance(value, int) else 600)


def launcher_args(devices: int, run_dir: Path, nodes: NodeArgs | None = None) -> list[str]:
    """torchrun's arguments: no restarts, ``devices`` ranks; one machine on a free port, or
    with ``nodes`` one node of a c10d rendezvous."""
    if nodes is None:
        where = ["--standalone", "--nnodes", "1"]
    else:
        where = [
            "--nnodes",
            str(nodes.nodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            nodes.endpoint,
            "--rdzv-id",
            nodes.rdzv_id,
            "--rdzv-conf",
            f"join_timeout={nodes.join_timeout_s},is_host={str(nodes.is_host).lower()}",
            "--local-addr",
            nodes.local_addr,
        ]
    return [
        *where,
        "--nproc-per-node",
        str(devices),
        "--max-restarts",
        "0",
        "--monitor-interval",
        str(MONITOR_INTERVAL_S),
        "-m",
        "amptrain.worker.child.rank",
        str(run_dir),
    ]


def launcher_command(devices: int, run_dir: Path, nodes: NodeArgs | None) -> list[str]:
    """The launcher, tied to this (supervising) process, with torchrun's arguments."""
    args = launcher_args(devices, run_dir, nodes)
    return [sys.executable, "-m", "amptrain.worker.child.launcher", str(os.getpid()), *args]


def attempt_outcome(
    results: dict[int, ControlMessage | None], launcher_code: int | None
) -> Finished | Failed:
    """How a data-parallel attempt ended, from each rank's result (None: it wrote none).

    Rank 0's :class:`Finished` only if every rank finished. Otherwise an error that is not
    ``internal`` wins (a rank's real cause: out of memory, bad data, non-finite loss), as
    its peers' broken collectives usually read ``internal``; then a rank that left no
    result (killed, crashed, hung and killed), naming a peer's error when there is one.
    """
    failures = sorted(
        ((rank, r) for rank, r in results.items() if isinstance(r, Failed)),
        key=lambda item: item[1].code == "internal",
    )
    if failures and failures[0][1].code != "internal":
        return failures[0][1]
    missing = [rank for rank, r in results.items() if r is None]
    if missing:
        seen = f"; process {failures[0][0]}: {failures[0][1].message}" if failures else ""
        return Failed(
            code="internal",
            message=(
                f"data-parallel process(es) {', '.join(map(str, missing))} of {len(results)} "
                f"ended without a result (the launcher exited with code {launcher_code}){seen}"
            ),
            step=None,
            retryable=True,
        )
    if failures:
        return failures[0][1]
    first = results[0]
    if not isinstance(first, Finished):
        raise ProtocolError(f"rank 0's result is not a result: {first!r}")
    return first


class RankGroup(ChildProcess):
    """The launcher and its ranks, behind :class:`ChildProcess`'s interface."""

    def __init__(
        self,
        launch: Launch,
        devices: int,
        gpus: str | None,
        passthrough: Sequence[str] = (),
        nodes: NodeArgs | None = None,
    ) -> None:
        self.devices = devices
        self.gpus = gpus
        self.run_dir = RunDir(Path(tempfile.mkdtemp(prefix=f"amptrain-{launch.job_id}-")))
        self.run_dir.write_atomic(self.run_dir.launch, launch.model_dump_json())
        self.run_dir.control.touch()
        self.proc = subprocess.Popen(
            launcher_command(devices, self.run_dir.path, nodes),
            stdin=subprocess.DEVNULL,
            env=child_env(gpus, passthrough=passthrough),
            text=True,  # (no pipes: only for the type ChildProcess declares)
        )
        self._control = self.run_dir.control.open("rb")
        self._partial = b""  # a control line not yet complete
        self._ended = False
        self._pending: signal.Signals | None = None
        self._failed_since: float | None = None
        self.accepted: Accepted | None = None
        log.info(
            "job %s: data-parallel launcher %d for %d ranks (GPUs %s) in %s",
            launch.job_id,
            self.proc.pid,
            devices,
            gpus or "none",
            self.run_dir.path,
        )

    # -- what the ranks said ---------------------------------------------------------------

    def messages(self, timeout: float) -> list[ControlMessage]:
        self._deliver_pending()
        self._end_lingering_ranks()
        got = self._read_control()
        if got:
            return got
        if self.alive():
            time.sleep(timeout)
            return self._read_control()
        if self._ended:
            return []
        self._ended = True
        self._kill_ranks()  # nothing may outlive the attempt
        return [*self._read_control(), self._outcome()]

    def finished(self) -> bool:
        return self._ended and not self.alive()

    def _read_control(self) -> list[ControlMessage]:
        self._partial += self._control.read()
        *lines, self._partial = self._partial.split(b"\n")
        got = []
        for line in lines:
            if not line.strip():
                continue
            try:
                msg = decode(line.decode("utf-8", errors="replace"))
            except ProtocolError as exc:
                log.error("data-parallel rank 0 of launcher %d: %s", self.pid, exc)
                continue
            if isinstance(msg, Accepted):
                self.accepted = msg
            got.append(msg)
        return got

    def results(self) -> dict[int, ControlMessage | None]:
        """Each rank's result, None for a rank that wrote none (yet)."""
        out: dict[int, ControlMessage | None] = {}
        for rank in range(self.devices):
            path = self.run_dir.result(rank)
            try:
                out[rank] = decode(path.read_text(encoding="utf-8")) if path.exists() else None
            except (OSError, ProtocolError) as exc:
                log.error("launcher %d: unreadable result of rank %d: %s", self.pid, rank, exc)
                out[rank] = None
        return out

    def _outcome(self) -> Finished | Failed:
        return attempt_outcome(self.results(), self.proc.returncode)

    # -- the ranks' processes ----------------------------------------------------------

    def rank_infos(self) -> list[dict[str, Any]]:
        """What each rank of this node that has started says of itself (global and local
        rank, pid, rendezvous port)."""
        infos = (self.run_dir.read_json(self.run_dir.rank_info(r)) for r in range(self.devices))
        return [info for info in infos if info is not None]

    def _rank_pids(self, ranks: set[int] | None = None) -> list[int]:
        """Ranks still alive, by pid (a pid is checked to be this attempt's rank first)."""
        mine = str(self.run_dir.path).encode()
        alive = []
        for info in self.rank_infos():
            if ranks is not None and _local(info) not in ranks:
                continue
            pid = int(info["pid"])
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # gone
            if mine in cmdline:
                alive.append(pid)
        return alive

    def _kill_ranks(self, without_result: set[int] | None = None) -> None:
        """SIGKILL every rank still alive (only those in ``without_result``, if given)."""
        for pid in self._rank_pids(without_result):
            log.warning("launcher %d: killing surviving data-parallel rank %d", self.pid, pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _end_lingering_ranks(self) -> None:
        """A rank failed: the others may be stuck in a collective or a hung step; torchrun
        would give them 30 s after its SIGTERM. End the ones with no result after a short
        grace, then the launcher if it still tears down. A stop on request (cancel,
        preempt) is no failure: those ranks checkpoint together and exit by themselves."""
        if self._ended or not self.alive():
            return
        results = self.results()
        if self._failed_since is None:
            if any(isinstance(r, Failed) and r.code not in STOPPED for r in results.values()):
                self._failed_since = time.monotonic()
            return
        waited = time.monotonic() - self._failed_since
        if waited >= FAILED_GRACE_S:
            self._kill_ranks(without_result=set(results) - {k for k, r in results.items() if r})
        if waited >= 2 * FAILED_GRACE_S:
            # Every rank has ended or said how; torchrun still tears down (~10 s on busy
            # cores): the outcome is known and the slot is wanted.
            log.warning("launcher %d: a rank failed %.0f s ago; ending it", self.pid, waited)
            self.proc.kill()

    def signal(self, signum: signal.Signals) -> None:
        """Stop requests go to this node's first rank (the engine makes every rank of every
        node agree at a flush); a
        request before the ranks exist waits for them. SIGTERM goes to the launcher, which
        forwards it to every rank."""
        if signum == signal.SIGTERM:
            super().signal(signum)
            return
        self._pending = signum
        self._deliver_pending()

    def _deliver_pending(self) -> None:
        if self._pending is None or not self.alive():
            return
        ranks = {_local(i): int(i["pid"]) for i in self.rank_infos()}
        if 0 in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(ranks[0], self._pending)
            self._pending = None

    def kill(self, grace: float) -> None:
        """SIGTERM to the launcher (forwarded to the ranks), then SIGKILL to all."""
        self.signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        self.abort()

    def abort(self) -> None:
        """Now: the launcher and every rank still alive (a lost lease)."""
        if self.alive():
            self.proc.kill()
        self._kill_ranks()
        self.proc.wait()

    def describe(self) -> dict[str, Any]:
        """The processes, as the ``started`` event shows them."""
        infos = sorted(self.rank_infos(), key=_local)
        ports = {str(i.get("master_port")) for i in infos if i.get("master_port")}
        return {
            "pid": self.accepted.pid if self.accepted else None,
            "warm": False,
            "launcher_pid": self.pid,
            "devices": self.devices,
            "gpus": self.gpus,
            "ranks": [{"rank": int(i["rank"]), "pid": int(i["pid"])} for i in infos],
            "rendezvous_port": int(ports.pop()) if len(ports) == 1 else None,
        }

    def close(self) -> None:
        self._control.close()
        if not self.alive():
            self._kill_ranks()
            shutil.rmtree(self.run_dir.path, ignore_errors=True)
        else:  # never: the watch returns only once the launcher exited
            log.error("launcher %d still runs; keeping %s", self.pid, self.run_dir.path)


def _local(info: dict[str, Any]) -> int:
    """A rank's index on its node (files and signals are per node)."""
    return int(info.get("local_rank", info["rank"]))
