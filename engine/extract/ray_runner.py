"""The Ray runner: the same job through Ray Data, one Engine per actor, on one machine or a cluster.

    read task (Ray Data datasource): the input file -> records.read_stream (the local runner's
        reader: same line numbers, ids, malformed-line failures) -> rows {"payload": JSON}, the
        records already in the output left out
      -> map_batches(ExtractWorker, concurrency=N): an actor pool, each actor holding one Engine
         (and so its own compiled-grammar cache); a batch runs through runner.run_records, the
         local runner itself, so every record is rendered, constrained and judged the same way
      -> rows {"result": output line}
      -> iter_batches on the driver -> output.ResultWriter (append + flush), as blocks finish

The records are read by Ray Data's file datasource machinery rather than ``read_json`` /
``read_csv`` / ``read_parquet`` because those infer Arrow types across the file: ``read_json``
stops the whole job at the first malformed line and fills absent fields with nulls, ``read_csv``
turns ``"007"`` into ``7``, and none of them knows line numbers, so ids, prompts and failures would
differ from the local runner's. The results come back to the driver instead of going through
``write_json``: that writes one file per block with Ray's own names, only once the block is done,
while the driver's writer keeps the job's contract -- one output file, appended and flushed per
record, resumable with the same ``--resume``, each id written once.

Needs ``pip install "formcast[ray]"`` on every node; the input path must be readable where the
read task runs (a shared file system on a cluster).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import ray.data
from ray.data.datasource import FileBasedDatasource

from .job import EngineFactory, RayOptions
from .records import SourceRecord, id_key, input_format, read_stream
from .results import ExtractResult
from .runner import run_records
from .spec import ExtractSpec

BLOCK_ROWS = 1024  # records per block out of the read task


def ray_results(input_path: Path, spec: ExtractSpec, engine_options: dict[str, Any], options: RayOptions,
                skip: set[str], engine_factory: EngineFactory) -> Iterator[ExtractResult]:  # fmt: skip
    """The results of every record of ``input_path`` whose id key is not in ``skip``; each actor
    builds its Engine with ``engine_factory`` (pickled by reference: importable in the actors)."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # the job draws its own bar and summary
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        dataset = ray.data.read_datasource(
            RecordsDatasource(str(Path(input_path).resolve()), spec.id_field, skip),
            num_cpus=0,  # reading is light; the CPUs belong to the engines
        )
        options_per_actor = {"num_threads": max(1, int(options.cpus_per_worker)), **engine_options}
        results = dataset.map_batches(
            ExtractWorker,
            fn_constructor_kwargs={"spec": spec.to_json(), "engine_options": options_per_actor, "engine_factory": engine_factory},
            batch_size=options.batch_size,
            batch_format="numpy",
            compute=_actor_pool(options.num_workers),
            num_cpus=options.cpus_per_worker,
        )
        for batch in results.iter_batches(batch_size=None, batch_format="numpy"):
            for line in batch["result"]:
                yield ExtractResult.from_json(json.loads(line))
    finally:
        if started:
            ray.shutdown()


def _actor_pool(size: int) -> Any:
    """``size`` actors, each running two batches at once on its Engine (which is thread-safe):
    while one batch drains its last long records, the next keeps the engine's batch full."""
    try:
        return ray.data.ActorPoolStrategy(size=size, max_concurrent_calls_per_actor=2, enable_true_multi_threading=True)
    except TypeError:  # a Ray before these options: one batch at a time per actor
        return ray.data.ActorPoolStrategy(size=size)


class ExtractWorker:
    """A Ray Data actor: one Engine, fed batches of records by ``map_batches``."""

    def __init__(self, spec: dict[str, Any], engine_options: dict[str, Any], engine_factory: EngineFactory) -> None:
        self.spec = ExtractSpec.from_json(spec)
        self.engine = engine_factory(**engine_options)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        records = [SourceRecord.from_payload(str(p)) for p in batch["payload"]]
        lines = [r.to_line().decode("utf-8").rstrip("\n") for r in run_records(self.engine, records, self.spec)]
        return {"result": np.array(lines, dtype=object)}


class RecordsDatasource(FileBasedDatasource):
    """One input file -> blocks of ``{"payload": SourceRecord JSON}``, leaving out ids in ``skip``."""

    def __init__(self, path: str, id_field: str, skip: set[str]) -> None:
        super().__init__(path, file_extensions=None)
        self.fmt = input_format(path)
        self.id_field = id_field
        self.skip = skip

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        rows: list[str] = []
        for record in read_stream(io.BufferedReader(f), self.fmt, self.id_field):
            if id_key(record.id) in self.skip:
                continue
            rows.append(record.to_payload())
            if len(rows) >= BLOCK_ROWS:
                yield pa.table({"payload": rows})
                rows = []
        if rows:
            yield pa.table({"payload": rows})
