"""What a job id is: ``j_`` and the 32 hex digits of a random UUID; and what a user may type
for one (a unique prefix, as ``amptrain jobs`` shortens ids on a narrow terminal)."""

from __future__ import annotations

import re
import uuid

JOB_ID = re.compile(r"j_[0-9a-f]{32}")
JOB_ID_PREFIX = re.compile(r"j_[0-9a-f]{1,32}")
"""A prefix the API looks up (``GET /jobs?id_prefix=``): at least one digit after ``j_``."""


def new_job_id() -> str:
    return "j_" + uuid.uuid4().hex
