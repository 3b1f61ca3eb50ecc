"""The GPU worker: three processes, one subpackage each.

- ``worker.main`` runs in the Celery main process (``amptrain worker``): the Celery app,
  signals, presence, metrics endpoint, device report. May import ``amptrain.core``,
  ``amptrain.store``, ``amptrain.contract`` and ``worker.child.protocol``.
- ``worker.pool`` runs in each forked Celery pool process (one per GPU): the task, the
  supervisor of one attempt, the child handle, the GPU slot, the slot's warm spare. May
  import what ``worker.main`` may, and ``worker.main`` itself (never the reverse).
- ``worker.child`` is the training process, a fresh process per attempt: either
  ``python -m amptrain.worker.child.main`` started for it, or a warm spare
  (``python -m amptrain.worker.child.spare``) started before it with torch imported and
  CUDA untouched; entry points, Redis sink, device probe. May import ``amptrain.engine``,
  ``amptrain.components``, ``amptrain.core`` and ``amptrain.contract``; never
  ``worker.main``, ``worker.pool``, ``amptrain.store``, SQLAlchemy or Celery (only the
  supervisor writes SQL, fenced by the attempt number).

``worker.main`` and ``worker.pool`` never import torch, numpy or the child's
``main``/``sink``/``probe``: pool processes are forked and CUDA does not survive a fork;
they learn about devices by running ``python -m amptrain.worker.child.probe``.
``worker.child.protocol`` is the torch-free seam between a supervisor and its child (the
launch parameters and the typed control messages). Nothing here imports
``amptrain.server``, ``amptrain.cli`` or ``amptrain.client``, and the API process never
imports the worker: it sends ``amptrain.run_job`` by name.

These rules are import-linter contracts in ``pyproject.toml`` (``lint-imports``).
"""
