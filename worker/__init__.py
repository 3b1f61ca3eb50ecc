"""The GPU worker: three processes, one subpackage each.

- ``worker.main`` runs in the Celery main process (``amptrain worker``): the
  Celery app, signals, presence, metrics endpoint, device report. May import
  ``api.core``, ``api.contracts``, ``api.store``, ``trainer_core.contract`` and
  ``worker.child.protocol``.
- ``worker.pool`` runs in each forked Celery pool process (one per GPU): the
  task, the supervisor of one attempt, the child handle, the GPU slot, the
  slot's warm spare. May
  import what ``worker.main`` may, and ``worker.main`` itself (never the reverse).
- ``worker.child`` is the training process, a fresh process per attempt: either
  ``python -m worker.child.main`` started for it, or a warm spare
  (``python -m worker.child.spare``) started before it with torch imported and
  CUDA untouched; entry points, Redis sink, device probe. May import ``trainer_core``
  (engine included), ``api.core`` and ``api.contracts``; never ``worker.main``,
  ``worker.pool``, ``api.store``, SQLAlchemy or Celery (only the supervisor writes
  SQL, fenced by the attempt number).

``worker.main`` and ``worker.pool`` never import torch, numpy or the child's
``main``/``sink``/``probe``: pool processes are forked and CUDA does not survive a
fork; they learn about devices by running ``python -m worker.child.probe``.
``worker.child.protocol`` is the torch-free seam between a supervisor and its
child (the launch parameters and the typed control messages). Nothing here
imports ``api.web``, ``api.services``, ``api.cli`` or ``api.client``, and the API
never imports ``worker``: it sends ``amptrain.run_job`` by name.

These rules are import-linter contracts in ``pyproject.toml`` (``lint-imports``).
"""
