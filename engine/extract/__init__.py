"""Batch extraction: every record of a file becomes one constrained request; results go to a
JSON-lines file that a killed job resumes without losing or repeating a record.

    formcast extract --input records.jsonl --output out.jsonl --schema schema.json \\
        --prompt-template "Extract the person: {text}" [--ray --num-workers 2]

    for result in engine.extract(records, schema=schema):       # Python: an iterator of results
        print(result.id, result.value, result.error)

Data flow::

    records.py     input file (JSON lines / CSV / Parquet) -> SourceRecord (line, id, fields | error)
    spec.py        ExtractSpec: constraint, prompt template, sampling -> SamplingParams, prompt text
    runner.py      the local runner: a window of records in flight on one Engine -> ExtractResult
    results.py     ExtractResult: value (parsed JSON / match), finish reason, tokens, error -> a line
    output.py      the output file: ids already done, torn-line repair, append + flush
    ray_runner.py  the same runner inside Ray Data actors (one Engine each), results back to output.py
    job.py         the command: output preparation, local or Ray, progress bar, summary

The modules that need neither torch nor Ray (records, spec, results, output) import neither.
"""

from .records import SourceRecord, id_key, read_records
from .results import ExtractError, ExtractResult, FailureType
from .spec import ExtractSpec

__all__ = ["ExtractError", "ExtractResult", "ExtractSpec", "FailureType", "SourceRecord", "id_key", "read_records"]
