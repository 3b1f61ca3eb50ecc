"""The one Celery task, run in a pool process. Only a job id travels through the broker.

Each pool process takes its :class:`~worker.pool.slot.PoolSlot` (index and GPU)
once, when Celery starts it, and hands it to every supervisor it runs.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.signals import worker_process_init

from api.core.enums import TaskName
from api.core.settings import get_settings
from worker.main import devices
from worker.main.celery_app import app
from worker.pool.slot import PoolSlot
from worker.pool.supervisor import Supervisor

log = logging.getLogger(__name__)

_pool_slot = PoolSlot()  # this pool process's, once worker_process_init has run


@worker_process_init.connect
def _take_slot(**_: Any) -> None:
    global _pool_slot
    _pool_slot = PoolSlot.of_this_process(devices.visible_gpus())


@app.task(name=TaskName.RUN_JOB, bind=True, ignore_result=True)
def run_job(self: Task, *args: Any, **kwargs: Any) -> None:
    # Any arguments are accepted so that a malformed message is logged and dropped here,
    # not raised as a task failure: anyone who can write to the broker can send one.
    if len(args) != 1 or kwargs or not isinstance(args[0], str):
        log.error(
            "dropped %s message %s: expected one job id, got args=%.200r kwargs=%.200r",
            TaskName.RUN_JOB,
            self.request.id,
            args,
            kwargs,
        )
        return
    hostname = self.request.hostname or "worker"
    Supervisor(get_settings(), hostname, _pool_slot).run(args[0])
