"""The one Celery task, run in a pool process. Only a job id travels through the broker.

Each pool process takes its :class:`~amptrain.worker.pool.slot.PoolSlot` (index and GPUs)
once, when Celery starts it, and hands it to every supervisor it runs. With
``AMPTRAIN_WARM_SPARE`` (the default) it also starts its slot's warm spare then
(:class:`~amptrain.worker.pool.spare.SpareKeeper`) and, as it lives on from job to job,
keeps one database engine and Redis client for all of them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from celery import Task
from celery.signals import worker_process_init, worker_process_shutdown
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.job_ids import JOB_ID
from amptrain.core import redis as amptrain_redis
from amptrain.core.enums import TaskName
from amptrain.core.lifeline import die_with
from amptrain.core.settings import get_settings
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.main import devices, drain
from amptrain.worker.main.celery_app import app
from amptrain.worker.pool.follower import Follower
from amptrain.worker.pool.send_back import send_back
from amptrain.worker.pool.slot import PoolSlot
from amptrain.worker.pool.spare import SpareKeeper
from amptrain.worker.pool.supervisor import Supervisor

log = logging.getLogger(__name__)

_pool_slot = PoolSlot()  # this pool process's, once worker_process_init has run
_spares: SpareKeeper | None = None
_shared: tuple[sessionmaker[Session], redis.Redis] | None = None


@worker_process_init.connect
def _take_slot(**_: Any) -> None:
    global _pool_slot, _spares
    # A worker main process that is killed (SIGKILL, `amptrain up` gone) takes its pool
    # processes with it, and they their training children: nothing trains unsupervised.
    die_with(os.getppid())
    drain.listen()
    _pool_slot = PoolSlot.of_this_process(devices.visible_gpus(), devices.devices_per_job())
    settings = get_settings()
    # A data-parallel slot launches its ranks through torchrun: a spare would sit unused.
    if settings.warm_spare and _pool_slot.devices_per_job == 1:
        _spares = SpareKeeper(_pool_slot.gpu, settings.child_env_passthrough).start()


@worker_process_shutdown.connect
def _retire_spare(**_: Any) -> None:
    # Its parent-death signal would kill it too; this is the orderly way.
    if _spares is not None:
        _spares.close()


def _connections() -> tuple[sessionmaker[Session], redis.Redis] | tuple[None, None]:
    """One engine and Redis client per pool process while it lives on (warm spares); a
    recycled pool process (one job each) builds its own in the supervisor."""
    global _shared
    if _spares is None:
        return None, None
    if _shared is None:
        settings = get_settings()
        _shared = (
            make_session_factory(make_engine(settings.database_url)),
            amptrain_redis.client(settings.redis_url, amptrain_redis.WORKER_TIMEOUT_S),
        )
    return _shared


def _dropped(
    task: Task,
    name: str,
    well_formed: bool,
    expected: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> bool:
    """Whether a message of the task ``name`` is dropped: one not ``well_formed`` (not the
    ``expected`` arguments) is logged and dropped, not raised as a task failure: anyone who
    can write to the broker can send one. The tasks accept any arguments for this."""
    if not well_formed:
        log.error(
            "dropped %s message %s: expected %s, got args=%.200r kwargs=%.200r",
            name,
            task.request.id,
            expected,
            args,
            kwargs,
        )
    return not well_formed


@app.task(name=TaskName.RUN_JOB, bind=True, ignore_result=True)
def run_job(self: Task, *args: Any, **kwargs: Any) -> None:
    well_formed = len(args) == 1 and not kwargs and isinstance(args[0], str)
    if _dropped(self, TaskName.RUN_JOB, well_formed, "one job id", args, kwargs):
        return
    hostname = self.request.hostname or "worker"
    sessions, client = _connections()
    settings = get_settings()
    supervisor = Supervisor(
        settings,
        hostname,
        _pool_slot,
        session_factory=sessions,
        redis_client=client,
        spares=_spares,
        send_join=_send_join,
    )
    supervisor.run(args[0])
    # Before this process takes its next message: a job it gave back goes first.
    send_back(settings, supervisor.sessions, args[0], _send_run)


def _send_run(job_id: str, queue: str, priority: int) -> None:
    app.send_task(
        TaskName.RUN_JOB, args=[job_id], queue=queue, priority=priority, ignore_result=True
    )


def _send_join(queue: str, job_id: str, attempt: int) -> None:
    """Ask ``queue`` for one more node of a multi-node attempt (ids only)."""
    app.send_task(TaskName.JOIN_JOB, args=[job_id, attempt], queue=queue, ignore_result=True)


@app.task(name=TaskName.JOIN_JOB, bind=True, ignore_result=True)
def join_job(self: Task, *args: Any, **kwargs: Any) -> None:
    well_formed = (
        len(args) == 2
        and not kwargs
        and isinstance(args[0], str)
        and type(args[1]) is int
        and args[1] > 0
        and JOB_ID.fullmatch(args[0]) is not None
    )
    if _dropped(self, TaskName.JOIN_JOB, well_formed, "a job id and an attempt", args, kwargs):
        return
    hostname = self.request.hostname or "worker"
    _, client = _connections()
    settings = get_settings()
    if client is None:  # a recycled pool process: one client for this message
        client = amptrain_redis.client(settings.redis_url, amptrain_redis.WORKER_TIMEOUT_S)
    Follower(settings, hostname, _pool_slot, client).run(args[0], args[1])
