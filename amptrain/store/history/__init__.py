"""A job's metric history in SQL: points, their step summaries, and downsampled reads.

- ``points``: metric points paged by the one cursor (``GET /jobs/{id}/metrics``).
- ``point_writes``: the recorder's inserts (PostgreSQL COPY, replays through ON CONFLICT).
- ``layout``: what a summary node holds; ``summaries`` its aggregates and node reads;
  ``summary_writes`` keeping them as points arrive; ``rebuild`` rebuilding them from the
  points; ``summary_reads`` reading a window from them.
- ``window``, ``raw_window``, ``downsample``: a whole run or a step window in at most N
  points (first/last/min/max per bucket, skipped and non-finite steps kept).
"""
