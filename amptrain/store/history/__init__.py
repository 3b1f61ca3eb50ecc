"""A job's metric history in SQL: points, chunks and their roll-ups, and downsampled reads.

- ``points``: metric points paged by the one cursor (``GET /jobs/{id}/metrics``).
- ``point_writes``: the recorder's inserts (PostgreSQL COPY, replays through ON CONFLICT).
- ``window``, ``downsample``: a whole run or a step window in at most N points
  (first/last/min/max per bucket, skipped and non-finite steps kept), the buckets from the
  chunks' roll-ups: ``rollups`` (kept by the recorder), ``rollup_rebuild`` (from stored
  chunks: migration 0016), ``chunk_cover`` (which roll-ups and decoded chunks hold a step
  range of the effective series across attempts), ``chunk_stats`` (their aggregates);
  the chosen steps' items from ``exemplar_reads``: from ``exemplars`` (per step roll-up
  block the full records at its notable steps, kept with the roll-ups; ``exemplar_build``
  from stored chunks: migration 0018) where a bucket holds whole blocks, else from the
  chunks (``chunk_pages.window_at``, which takes only the wanted values of each chunk:
  ``chunk_pick``; ``chunk_pages.window_between`` for a full-resolution window).
  ``eval_window``: the evaluation and layer-norm windows, from each name's roll-ups
  (``chunk_stats.series_stats``) and the chosen records' chunks.
- ``layout``, ``summaries``, ``summary_writes``, ``summary_reads``: the step summaries the
  reads used before the roll-ups; no longer written by the recorder nor read by the API
  (tests/support/summary_window.py keeps that read as a test oracle). ``rebuild``: a
  job's summaries, chunks and roll-ups from its rows (points seeded by tests and benches).
- ``chunk_codec``, ``chunk_parts``, ``chunk_merge``, ``chunk_writes``, ``series_scan``:
  every series of a job (each per-step field, eval metric and layer norm, and the reserved
  series that rebuild a record: cursor, record time, per-rank memory) in
  ``metric_chunks``, 256 aligned steps of one attempt packed in a row, appended by the
  recorder in the batch's transaction (``chunk_merge``: a chunk's contents with a batch's
  new steps) and streamed whole by :func:`series_scan.scan_run` (the whole-run export's
  reader).
- ``chunk_index`` (which chunks a read needs; numpy-free), ``chunk_load`` (fetching and
  decoding them), ``chunk_reads`` (records by cursor range or steps, effective or all
  attempts), ``chunk_pages`` (the cursor pages' dicts, the newest record, ``points_at``):
  the cursor pages of ``points`` and ``values`` read the chunks.
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
