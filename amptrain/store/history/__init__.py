"""A job's metric history in SQL: points, their step summaries, and downsampled reads.

- ``points``: metric points paged by the one cursor (``GET /jobs/{id}/metrics``).
- ``point_writes``: the recorder's inserts (PostgreSQL COPY, replays through ON CONFLICT).
- ``layout``: what a summary node holds; ``summaries`` its aggregates and node reads;
  ``summary_writes`` keeping them as points arrive; ``rebuild`` rebuilding them from the
  points; ``summary_reads`` reading a window from them.
- ``window``, ``raw_window``, ``downsample``: a whole run or a step window in at most N
  points (first/last/min/max per bucket, skipped and non-finite steps kept).
- ``chunk_codec``, ``chunk_writes``, ``series_scan``: every series of a job (each per-step
  field, eval metric and layer norm) in ``metric_chunks``, 256 aligned steps of one
  attempt packed in a row, appended by the recorder in the batch's transaction and
  streamed whole by :func:`series_scan.scan_run` (the whole-run export's reader). The
  cursor pages and downsampled reads above still read the per-value rows.
- ``chunk_tail``: a series' values from its chunks newest step first, without numpy (of
  one attempt or the effective series), its effective count and highest value, an
  attempt's newest cursor millisecond: what ``throughput`` (the steady samples/s), the
  comparison report, the alert windows and the stall watch read.

What a job's history costs per step (``bench/storage_size.py``, this machine): the step
point's row about 27 bytes a value on SQLite, 41 on PostgreSQL, indexes included (~12
values: 320-490 bytes a step) plus its summaries; its chunks about 4 bytes a value (~50 a
step); each layer norm 250 (SQLite) / 340 (PostgreSQL) bytes as a row plus about 6 in its
chunk.
"""
