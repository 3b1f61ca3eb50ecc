"""The one Celery task. Only the job id travels through the broker."""

from __future__ import annotations

from api.core.settings import get_settings
from worker.main.celery_app import RUN_JOB, app
from worker.pool.supervisor import Supervisor


@app.task(name=RUN_JOB, bind=True, ignore_result=True)
def run_job(self: object, job_id: str) -> None:
    hostname = getattr(getattr(self, "request", None), "hostname", None) or "worker"
    Supervisor(get_settings(), worker=hostname).run(job_id)
