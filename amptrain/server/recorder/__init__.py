"""The recorder: Redis telemetry streams into SQL (runs in the API process as a thread, or
as ``amptrain recorder``, a process of its own).

- ``service``: :class:`Recorder`, the pass loop: read every owned job's stream through a
  consumer group and hand the entries to the writer.
- ``writer``: one batch of entries into SQL (points, events, chunks and their roll-ups,
  progress) in one transaction, then the acknowledgement; events relayed into streams; a
  stream's end.
- ``entries``: stream entries parsed into rows (hiredis's flat field lists, one pass).
- ``plain_points``: the common case, plain metric entries, decoded a batch at a time.
- ``group``: the consumer group of a job's stream (create, claim what a dead recorder
  left pending).
- ``owner``: which recorder owns which job (a Redis lock per job, renewed in batches).
- ``process``: ``amptrain recorder``, the recorder in a process of its own.
"""
