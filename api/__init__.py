"""The control plane: the HTTP API process and what it shares with the worker.

Layered, each subpackage importing only those below it
(``cli > web > services > store > contracts > core``):

- ``api.core`` (API and worker): settings, logging, the one Redis client factory
  and every key name (``Keys``), enums (``JobStatus``, ``TaskName``). Imports
  only the standard library, pydantic(-settings) and redis.
- ``api.contracts`` (API and worker): the telemetry stream format, the one
  ``Cursor`` type, worker presence. Imports ``api.core`` and
  ``trainer_core.contract``.
- ``api.store`` (API and worker): SQLAlchemy models, migrations, the fenced job
  repository, the dispatcher's outbox queries, tokens, telemetry reads and
  writes: the only place SQL is written. Imports SQLAlchemy, Alembic,
  ``api.contracts``, ``api.core`` and ``trainer_core.contract``.
- ``api.services`` (API process, background): runtime (the sole owner of the
  process's engine, Redis clients, threads and live hub), dispatcher,
  reconciler, broker (all kombu knowledge), recorder, live hub, watch,
  observability.
- ``api.web`` (API process, requests): the FastAPI app, deps, errors, auth,
  schemas, routes, the dashboard's static files.
- ``api.cli`` (the ``amptrain`` command): the entry point with lazy command
  groups, server commands, ``up``, the embedded Redis. May import any of the above.
- ``api.client`` (users' machines, the ``client`` extra): the HTTP/WebSocket
  client and ``amptrain submit|watch|jobs|cancel|logs``. Imports nothing of
  the server stack: no other ``api`` subpackage, SQLAlchemy, FastAPI,
  Starlette, redis, Celery or torch.

Nothing in ``api`` imports torch, numpy or ``worker`` (jobs are sent as
``amptrain.run_job`` by name), and of ``trainer_core`` only the torch-free
``trainer_core.contract``. The worker may import ``api.core``,
``api.contracts`` and ``api.store``, never ``api.services``, ``api.web``,
``api.cli`` or ``api.client``. These rules are import-linter contracts in
``pyproject.toml`` (``lint-imports``).
"""
