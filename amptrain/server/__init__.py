"""The API process: ``web`` (requests), ``runtime`` (the one owner of the process's
engine, Redis clients and background threads), ``dispatcher`` and ``reconciler`` (the
jobs table as outbox, repair of lost work), ``broker`` (all kombu knowledge), ``recorder``
(streams into SQL), ``live`` (the live hub and watchers), ``limits``, ``token_checks`` and
``observability``. Never imports torch, the engine or the worker."""
