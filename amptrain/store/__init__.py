"""The SQL store, the only place SQL is written: models, engines and sessions (``db``),
migrations, the fenced job repository (``jobs``), reads for the API, the outbox, tokens,
quotas, comparisons, the recorder's writes (``recording``), and ``history``: a job's
metric history in chunks and roll-ups, its cursor pages and downsampled reads."""
