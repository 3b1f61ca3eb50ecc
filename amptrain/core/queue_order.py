"""Where a job's message goes in its Celery queue, so that a job keeps its place.

kombu's Redis transport keeps one list per priority step of a queue and a worker pops the
lists in step order (0 before 3), first in first out within one. A job sent for the first
time goes to :data:`FIRST_SEND`; a job that ran and came back (a retry, a precision
fallback, a drain) goes to :data:`RETURNING`, ahead of every job that has not started yet:
each of those was submitted after it (one queue is first in first out), so it runs before
them, as a person who submitted it first expects. An fp16 job re-queued after a fallback
at step 3 no longer waits behind a 30,000-step job submitted after it.
"""

from __future__ import annotations

RETURNING = 0
"""The priority of a job that ran before (attempt > 0): popped first."""
FIRST_SEND = 3
"""The priority of a job that never ran: after every returning job of its queue."""


def send_priority(attempt: int) -> int:
    """The priority a job's message is sent with, by the attempts it has had."""
    return RETURNING if attempt > 0 else FIRST_SEND
