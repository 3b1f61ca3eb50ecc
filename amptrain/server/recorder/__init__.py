"""The recorder: Redis telemetry streams into SQL (runs in the API process as a thread, or
as ``amptrain recorder``, a process of its own).

- ``service``: :class:`Recorder`, the pass loop: read every owned job's stream through a
  consumer group, commit its points, events and summaries in one transaction, then ack.
- ``entries``: stream entries parsed into rows (hiredis's flat field lists, one pass).
- ``group``: the consumer group of a job's stream (create, claim what a dead recorder
  left pending).
- ``owner``: which recorder owns which job (a Redis lock per job, renewed in batches).
- ``process``: ``amptrain recorder``, the recorder in a process of its own.
"""
