"""Input records: JSON lines, CSV or Parquet -> ``SourceRecord`` (position, id, fields or error).

Both runners read through these functions (the local runner in its own process, the Ray runner
inside a Ray read task), so a record gets the same id, the same fields and the same failure on
either path.

* The position ``line`` counts from 1: the line a record starts on in a JSON-lines or CSV file
  (the CSV header is line 1), the row number in a Parquet file.
* The id is the record's ``id_field`` (a string or an integer); a record without that field gets
  its ``line`` as id. A record whose id was already used is a ``duplicate_id`` failure.
* A line that cannot be read (not JSON, not an object, invalid UTF-8, a CSV row with the wrong
  number of fields) is a ``malformed_line`` failure carrying its line number: reported, never
  dropped. Blank lines of a JSON-lines file are not records.
* Parquet values are normalized through JSON (``default=str`` for dates, decimals, bytes), so a
  prompt renders the same whether the record travelled through Ray or not.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .results import ExtractError, FailureType

RecordId = str | int
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class SourceRecord:
    """One input record: where it came from, its id, and its fields or why it could not be read."""

    line: int
    id: RecordId
    fields: dict[str, Any] | None  # None when the record could not be read
    error: ExtractError | None = None

    def to_payload(self) -> str:
        """JSON text (how a record travels between Ray tasks)."""
        error = None if self.error is None else [self.error.type, self.error.message]
        return json.dumps({"line": self.line, "id": self.id, "fields": self.fields, "error": error}, default=str)

    @classmethod
    def from_payload(cls, text: str) -> SourceRecord:
        data = json.loads(text)
        error = None if data["error"] is None else ExtractError(*data["error"])
        return cls(data["line"], data["id"], data["fields"], error)


def id_key(record_id: Any) -> str:
    """The key that tells ids apart (``1`` and ``"1"`` are different ids)."""
    return json.dumps(record_id, ensure_ascii=False)


def input_format(path: str | Path) -> str:
    """``jsonl``, ``csv`` or ``parquet``, from the file name; ``ValueError`` otherwise."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown input format; the file name must end in {', '.join(FORMATS)}")
    return fmt


def read_records(path: str | Path, id_field: str = "id") -> Iterator[SourceRecord]:
    """The records of a local file, in file order."""
    fmt = input_format(path)
    with open(path, "rb") as f:
        yield from read_stream(f, fmt, id_field)


def read_stream(f: BinaryIO, fmt: str, id_field: str = "id") -> Iterator[SourceRecord]:
    """The records of an open binary file in format ``fmt`` (the Ray read task's entry point)."""
    rows = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[fmt](f)
    return with_ids(rows, id_field)


def from_dicts(records: Iterable[Any], id_field: str = "id", text_field: str = "text") -> Iterator[SourceRecord]:
    """Records handed to ``Engine.extract``: dicts, or plain strings (taken as ``text_field``);
    a record's ``line`` is its position, counting from 1."""

    def rows() -> Iterator[tuple[int, dict | None, ExtractError | None]]:
        for number, item in enumerate(records, 1):
            if isinstance(item, str):
                yield number, {text_field: item}, None
            elif isinstance(item, dict):
                yield number, item, None
            else:
                yield number, None, _malformed(f"record {number}: expected a dict or a string, got {type(item).__name__}")

    return with_ids(rows(), id_field)


def with_ids(rows: Iterable[tuple[int, dict | None, ExtractError | None]], id_field: str) -> Iterator[SourceRecord]:
    """Attach ids; a repeated id becomes a ``duplicate_id`` failure."""
    first_line: dict[str, int] = {}
    for line, fields, error in rows:
        record_id: Any = line
        if fields is not None and id_field in fields:
            record_id = fields[id_field]
            if isinstance(record_id, bool) or not isinstance(record_id, (str, int)):
                shown = json.dumps(record_id, default=str)[:80]
                error = ExtractError(FailureType.INVALID_RECORD, f"line {line}: id field {id_field!r} must be a string or an integer, got {shown}")
                record_id, fields = line, None
        key = id_key(record_id)
        if key in first_line and error is None:
            error = ExtractError(FailureType.DUPLICATE_ID, f"line {line}: id {key} was already used on line {first_line[key]}")
            fields = None
        first_line.setdefault(key, line)
        yield SourceRecord(line, record_id, fields, error)


def count_records(path: str | Path) -> int:
    """How many records ``read_records`` will yield, cheaply (for the progress bar's total)."""
    fmt = input_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as f:
        lines = sum(1 for line in f if line.strip())
    return lines - 1 if fmt == "csv" and lines else lines  # a CSV's header is no record


# ---------------------------------------------------------------------- formats


def _malformed(message: str) -> ExtractError:
    return ExtractError(FailureType.MALFORMED_LINE, message)


def _jsonl_rows(f: BinaryIO) -> Iterator[tuple[int, dict | None, ExtractError | None]]:
    for number, raw in enumerate(f, 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            yield number, None, _malformed(f"line {number}: not valid UTF-8 ({exc.reason} at byte {exc.start})")
            continue
        except json.JSONDecodeError as exc:
            yield number, None, _malformed(f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})")
            continue
        if not isinstance(value, dict):
            yield number, None, _malformed(f"line {number}: expected a JSON object, got {type(value).__name__}")
            continue
        yield number, value, None


def _csv_rows(f: BinaryIO) -> Iterator[tuple[int, dict | None, ExtractError | None]]:
    # Bad bytes become U+FFFD rather than stopping the reader for the rest of the file.
    text = io.TextIOWrapper(f, encoding="utf-8", errors="replace", newline="")
    reader = csv.reader(text)
    try:
        header = next(reader)
    except StopIteration:
        return
    end = reader.line_num
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            end = reader.line_num
            yield start, None, _malformed(f"line {start}: not a valid CSV row ({exc})")
            continue
        end = reader.line_num
        if not row:
            continue  # a blank line
        if len(row) != len(header):
            yield start, None, _malformed(f"line {start}: has {len(row)} fields; the header has {len(header)}")
            continue
        yield start, dict(zip(header, row)), None


def _parquet_rows(f: BinaryIO) -> Iterator[tuple[int, dict | None, ExtractError | None]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = f if f.seekable() else pa.BufferReader(f.read())  # Parquet needs random access
    number = 0
    for batch in pq.ParquetFile(source).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            number += 1
            yield number, json.loads(json.dumps(row, default=str)), None
