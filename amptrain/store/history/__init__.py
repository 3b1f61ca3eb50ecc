"""A job's metric history in SQL: every series in chunks and their roll-ups (the only
tables of it since migration 0017 dropped the per-value rows and the step summaries), and
the reads.

- ``points``: metric points paged by the one cursor (``GET /jobs/{id}/metrics``);
  ``values``: the evaluations' and layer norms' pages.
- The recorder writes a batch through :func:`rollups.record` (chunks, then roll-ups) and
  learns what is new in it from what the chunks gained (``gained``: an appending part
  itself, no dict per series; a replay gains nothing); its plain step points arrive as
  columns (``point_columns``), a chunk's step series are aggregated as one numpy block
  before the write (``block_stats``; the chunk rows' lowest/highest/non-finite columns and
  the roll-ups take it; the aggregates' type: ``rollup_stats``), and ``throughput`` decides a job's steady rate from the batch when it
  can; ``eval_summary``: a job's newest evaluation (``jobs.eval_summary``) from the chunks.
- ``window``, ``downsample``: a whole run or a step window in at most N points
  (first/last/min/max per bucket, skipped and non-finite steps kept), the buckets from the
  chunks' roll-ups: ``rollups`` (kept by the recorder, upserted on PostgreSQL in one
  statement: ``db.upsert_many``; only for the series a read aggregates,
  ``chunk_parts.rolled_up``: no reserved series but a named kind's cursor),
  ``rollup_rebuild`` (from stored chunks: migration 0016, and a job whose rows 0017
  moved), ``chunk_cover`` (which
  roll-ups and decoded chunks hold a step range of the effective series across
  attempts), ``chunk_stats`` (their aggregates);
  the chosen steps' items from ``exemplar_reads``: from ``exemplars`` (per step roll-up
  block the full records at its notable steps, kept with the roll-ups; ``exemplar_build``
  from stored chunks: migration 0018) where a bucket holds whole blocks, else from the
  chunks (``chunk_pages.window_at``, which takes only the wanted values of each chunk:
  ``chunk_pick``; ``chunk_pages.window_between`` for a full-resolution window).
  ``eval_window``: the evaluation and layer-norm windows, from each name's roll-ups
  (``chunk_stats.series_stats``; the layer norms' kept steps folded over every name at once
  in numpy: ``layer_buckets``) and the chosen records' chunks.
- ``chunk_codec``, ``chunk_parts``, ``chunk_merge``, ``chunk_writes``, ``chunk_table``,
  ``series_scan``:
  every series of a job (each per-step field, eval metric and layer norm, and the reserved
  series that rebuild a record: cursor, record time, per-rank memory) in
  ``metric_chunks``, 256 aligned steps of one attempt packed in a row, appended by the
  recorder in the batch's transaction (``chunk_merge``: a chunk's contents with a batch's
  new steps; migrations 0014, 0015 and 0017 moved the rows in; ``chunk_table``: the
  statements, the open chunks apart from the closed since 0021) and streamed whole by
  :func:`series_scan.scan_run` (the whole-run export's reader).
- ``chunk_index`` (which chunks a read needs; numpy-free), ``chunk_load`` (fetching and
  decoding them), ``chunk_reads`` (records by cursor range or steps, effective or all
  attempts), ``chunk_pages`` (the cursor pages' dicts, the newest record, ``points_at``):
  the cursor pages of ``points`` and ``values`` read the chunks.
- ``chunk_tail``: a series' values from its chunks newest step first, without numpy (of
  one attempt or the effective series), its effective count and highest value, an
  attempt's newest cursor millisecond: what ``throughput`` (the steady samples/s), the
  comparison report, the alert windows and the stall watch read.

What a job's history costs, per database and batch size, as held and compacted:
``docs/concepts/metric-history.md`` (``bench/storage_size.py``).
"""
