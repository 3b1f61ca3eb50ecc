"""A whole run's history as one Parquet or CSV file, written as it is read.

The series of :func:`amptrain.store.history.series_scan.scan_run` become Arrow record batches
of at most :data:`BATCH_ROWS` rows in the long ("tidy") layout that :func:`amptrain.server.web.routes.export.export_job`
documents; each batch
is encoded into a sink the HTTP response drains, so an export holds one batch in memory
whatever the run's length. pyarrow and numpy are imported here only: the API process imports
this module when the first export is asked, never at start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
from sqlalchemy.orm import Session, sessionmaker

from amptrain.store.history.series_scan import SeriesBlock, scan_run

if TYPE_CHECKING:
    from amptrain.server.web.routes.export import ExportFormat

MEDIA_TYPES: dict[str, str] = {
    "parquet": "application/vnd.apache.parquet",
    "csv": "text/csv; charset=utf-8",
}
BATCH_ROWS = 262_144
"""Rows per record batch (one Parquet row group): 4 MiB of steps and values, large enough
that encoding, not per-batch overhead, sets the pace."""

_TEXT = pa.dictionary(pa.int32(), pa.string())


def schema(with_job: bool) -> pa.Schema:
    """The columns of an export (a comparison's leads with ``job``)."""
    fields = [("kind", _TEXT), ("series", _TEXT), ("step", pa.int64()), ("value", pa.float64())]
    return pa.schema([("job", _TEXT), *fields] if with_job else fields)


def export_stream(
    sessions: sessionmaker[Session], job_ids: list[str], fmt: ExportFormat, with_job: bool
) -> Iterator[bytes]:
    """The bytes of the export of ``job_ids`` (each after the other) in ``fmt``, in pieces
    as they are encoded. Reads in its own session (the request's is closed once the handler
    returns, before the body streams); on PostgreSQL in one repeatable-read snapshot, so a
    running job's series all end at the same recorded moment."""
    with sessions() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        tagged = ((job_id, block) for job_id in job_ids for block in scan_run(session, job_id))
        yield from encode(batches(tagged, with_job), fmt, schema(with_job))


def encode(
    source: Iterable[pa.RecordBatch], fmt: ExportFormat, shape: pa.Schema
) -> Iterator[bytes]:
    """``source`` encoded as one ``fmt`` file, yielded batch by batch."""
    sink = Drain()
    writer: Any
    if fmt == "parquet":
        # Dictionary pages only for the names; steps (increasing) delta-packed.
        writer = pq.ParquetWriter(
            sink,
            shape,
            compression="snappy",
            use_dictionary=[n for n in shape.names if n not in ("step", "value")],
            column_encoding={"step": "DELTA_BINARY_PACKED"},
        )
    else:
        writer = pa_csv.CSVWriter(sink, shape)
    try:
        for batch in source:
            writer.write_batch(batch)
            yield from sink.take()
    finally:
        writer.close()
    yield from sink.take()


class Drain:
    """A write-only file that keeps what it is given until :meth:`take`: the sink pyarrow's
    writers encode into and the response empties."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        part = bytes(data)  # a copy: pyarrow may reuse its buffer
        self.parts.append(part)
        self.written += len(part)
        return len(part)

    def tell(self) -> int:
        return self.written

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> Iterator[bytes]:
        """What was written since the last call, as one piece (none when nothing was)."""
        if self.parts:
            joined = b"".join(self.parts)
            self.parts.clear()
            yield joined


def batches(
    tagged: Iterable[tuple[str, SeriesBlock]], with_job: bool, rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Blocks (each with its job) gathered into record batches of about ``rows`` rows (a
    block longer than that is cut)."""
    pending: list[tuple[str, SeriesBlock]] = []
    held = 0
    for job_id, block in tagged:
        size, start = len(block.steps), 0
        while start < size:
            take = min(size - start, rows - held)
            pending.append((job_id, block if take == size else _cut(block, start, take)))
            held += take
            start += take
            if held >= rows:
                yield _batch(pending, with_job)
                pending, held = [], 0
    if pending:
        yield _batch(pending, with_job)


def _cut(block: SeriesBlock, start: int, size: int) -> SeriesBlock:
    end = start + size
    return SeriesBlock(block.kind, block.name, block.steps[start:end], block.values[start:end])


def _batch(pieces: list[tuple[str, SeriesBlock]], with_job: bool) -> pa.RecordBatch:
    lengths = numpy.fromiter((len(b.steps) for _, b in pieces), numpy.int64, len(pieces))
    columns = [
        _labels([b.kind for _, b in pieces], lengths),
        _labels([b.name for _, b in pieces], lengths),
        pa.array(numpy.concatenate([b.steps for _, b in pieces]), pa.int64()),
        pa.array(numpy.concatenate([b.values for _, b in pieces]), pa.float64()),
    ]
    if with_job:
        columns.insert(0, _labels([j for j, _ in pieces], lengths))
    return pa.RecordBatch.from_arrays(columns, schema=schema(with_job))


def _labels(names: list[str], lengths: numpy.ndarray) -> pa.DictionaryArray:
    """A dictionary column repeating ``names[i]`` ``lengths[i]`` times."""
    words: dict[str, int] = {}
    codes = numpy.fromiter(
        (words.setdefault(n, len(words)) for n in names), numpy.int32, len(names)
    )
    return pa.DictionaryArray.from_arrays(
        pa.array(numpy.repeat(codes, lengths), pa.int32()), pa.array(list(words), pa.string())
    )
