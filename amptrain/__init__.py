"""amptrain: a training service for PyTorch teams.

The folders are the processes. Each subpackage says which process runs its code and
what it may import (import-linter contracts in ``pyproject.toml``; ``lint-imports`` runs
in the test suite):

- ``amptrain.contract`` (everywhere, torch-free): the job spec and its file loader, the
  catalog and plugin registrations, **the one table of metric definitions**
  (``contract.metrics``), record and stream formats, the one ``Cursor``, errors,
  checkpoint layout, limits. Imports pydantic, yaml and the standard library only.
- ``amptrain.core`` (every server process): settings (``AMPTRAIN_*``), logging, the one
  Redis client factory and every key name (``Keys``), enums (``JobStatus``,
  ``TaskName``), worker presence, the telemetry stream writer, the one parent-death helper
  (``core.lifeline``).
- ``amptrain.store`` (API, recorder, worker supervisor): SQLAlchemy models, migrations,
  the fenced job repository, tokens, the dispatcher's outbox queries: the only place SQL
  is written. ``store.history`` holds a job's metric history: every series packed in
  chunks (``metric_chunks``) and their roll-ups (``metric_rollups``), the cursor pages and
  downsampled reads, and ``store.history.series_scan``, which streams a run whole.
- ``amptrain.engine`` and ``amptrain.components`` (the training process): the precision
  policy, the AMP loop (``engine.loop``: the Trainer; ``engine.train_state``), device-side
  telemetry, the numerics guardian (``engine.guardian``: one verdict per flush, acted on by
  the Trainer), the data path, checkpoints (``engine.checkpoint_manager``); built-in
  models, datasets, losses, optimizers and the registry that builds them. Pure PyTorch:
  never Redis, SQL, Celery, the web stack or environment variables.
- ``amptrain.server`` (the API process, and ``amptrain recorder``): ``server.web`` (the
  FastAPI app, deps, errors, auth, routes, the dashboard's static files), ``runtime`` (the
  sole owner of the process's engine, Redis clients and threads), ``dispatcher``,
  ``reconciler``, ``broker`` (all kombu knowledge), ``server.recorder`` (Redis streams
  into SQL), ``server.live`` (the live hub and watchers), observability.
- ``amptrain.worker`` (GPU workers): ``worker.main`` in the Celery main process,
  ``worker.pool`` in each forked pool process (one per GPU: the task, the supervisor of one
  attempt), ``worker.child`` the training process (a fresh one per attempt). Imports
  ``core``, ``contract`` and ``store`` (never ``server``); only the child imports the
  engine, and only the supervisor writes SQL.
- ``amptrain.client`` (users' machines, the ``client`` extra): the HTTP/WebSocket client
  and ``amptrain submit|watch|jobs|cancel|logs``; nothing of the server stack.
- ``amptrain.cli`` (the ``amptrain`` command): the entry point with lazy command groups,
  ``up`` and its ordered stop (``cli.up_stop``), the server commands, the embedded Redis,
  ``amptrain train`` (``cli.train``).
- ``amptrain.migrations``: the Alembic revisions (``amptrain db upgrade``).

The API process never imports torch or the worker: it sends ``amptrain.run_job`` by name.

Adding a built-in per-step metric: a row in ``contract/metrics.py`` (name, type, unit,
whether its extremes are kept in downsampled reads, which chart shows it) and the code
that computes it in ``engine/telemetry.py``; no migration (each field is its own series of
chunks). The records, the stream, the recorder, the chunks, the API schemas,
``GET /catalog``, the dashboard and both command lines follow from the table.
"""
