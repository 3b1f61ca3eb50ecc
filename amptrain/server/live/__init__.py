"""Live fan-out: every WebSocket / SSE watcher of a job fed by one Redis reader per job per
process.

- ``hub``: :class:`LiveHub`, one blocking stream reader per watched job, bounded
  per-watcher queues, pacing of batch watchers.
- ``watch``: one watcher's messages: history from SQL after its cursor, then the live tail,
  de-duplicated at the seam.
- ``history``: the history part of a watch (pages of points and events from SQL).
- ``messages``: the message shapes (``metric``, ``event``, ``batch``, ``end``, ...).
"""
