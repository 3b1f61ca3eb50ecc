"""A job the attempt just gave back to its queue (a retry, a precision fallback) is sent
again by the pool process itself, before the process takes its next message.

Left to the dispatcher's sweep (every few seconds) the freed slot took the next message
first: a job submitted after it. Sent here with :data:`~amptrain.core.queue_order.RETURNING`
priority, it is the next message its queue hands out, so it keeps its place. If the
broker refuses, the sweep sends it as before (a duplicate is harmless: the claim decides).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.queue_order import send_priority
from amptrain.core.settings import Settings
from amptrain.store import outbox

log = logging.getLogger(__name__)

Send = Callable[[str, str, int], None]
"""``send(job_id, queue, priority)``: publish one ``run_job`` message."""


def send_back(settings: Settings, sessions: sessionmaker[Session], job_id: str, send: Send) -> bool:
    """Send ``job_id`` again now if it came back to its queue; whether it was sent."""
    with sessions() as s:
        found = outbox.returned(s, job_id)
    if found is None:
        return False
    queue, attempt = found
    if queue not in settings.routable_queues:
        return False  # the dispatcher refuses it, naming why
    try:
        send(job_id, queue, send_priority(attempt))
    except Exception as exc:  # kombu raises many kinds; all mean "not sent": the sweep will
        log.warning("could not send %s back to %s (the dispatcher will): %s", job_id, queue, exc)
        return False
    with sessions.begin() as s:
        outbox.mark_dispatched(s, job_id)
    log.info("job %s sent back to the head of queue %s", job_id, queue)
    return True
