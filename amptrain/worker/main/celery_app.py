"""The Celery app of the worker: dispatch only, never the source of truth.

Every setting below answers a pitfall of Celery on a Redis broker, measured
before it was chosen: acknowledgements are only emulated there, so a long task
is re-delivered or lost. Recovery of lost or stuck jobs is amptrain's own lease
+ reconciler, not Celery's.
"""

from __future__ import annotations

from celery import Celery

from amptrain.core.settings import get_settings


def make_celery(broker_url: str, *, warm_spare: bool = False) -> Celery:
    app = Celery(
        "amptrain",
        broker=broker_url,
        include=["amptrain.worker.pool.tasks", "amptrain.worker.main.signals"],
    )
    app.conf.update(
        # Early ack: with late acks Redis re-delivers any task still running after
        # visibility_timeout (1 h), so a long job would run twice. A message lost
        # with a dying worker is recovered by the reconciler from SQL instead.
        task_acks_late=False,
        # Reserve nothing in advance: a prefetched job would wait behind a
        # long one (and, unacked, run twice after the visibility timeout).
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        # A fresh pool process per job, unless it keeps a warm spare training process
        # (AMPTRAIN_WARM_SPARE), which must outlive the job to be ready for the next.
        # Either way the pool process never imports torch and every job trains in a
        # process of its own, so no CUDA context passes from one job to the next.
        worker_max_tasks_per_child=None if warm_spare else 1,
        # Celery 6 flips this default; then a Redis blip would kill running jobs.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        # JSON only: no pickles, no user code through the broker; only ids travel.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_default_queue="gpu",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


_settings = get_settings()
app = make_celery(_settings.broker_url, warm_spare=_settings.warm_spare)
