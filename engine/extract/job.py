"""``formcast extract`` as a job: input file -> runner (local or Ray) -> output file, with a
progress bar and a summary.

    prepare the output: --overwrite empties it, --retry-failed drops its failed lines, and a
        torn last line is repaired; the ids it holds are skipped (--resume, the default)
    local: records.read_records -> skip done ids -> runner.run_records on one Engine
    --ray: ray_runner.ray_results (same reader, same runner, inside Ray actors)
      -> output.ResultWriter, one flushed line per record as it finishes
      -> tqdm bar on stderr (records/s, ETA, failures, output tokens/s), JobSummary at the end
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .output import ResultWriter, drop_failures, read_existing
from .records import count_records, id_key, input_format, read_records
from .results import ExtractResult
from .spec import ExtractSpec

if TYPE_CHECKING:  # pragma: no cover
    from ..entrypoints.engine import Engine

# The job builds its Engines (one, or one per Ray actor) with the factory its caller hands over,
# ``Engine`` itself for the CLI: the extraction package is an application on top of the Engine
# and never imports the entry points (which import it).
EngineFactory = Callable[..., "Engine"]


@dataclass
class RayOptions:
    """``--ray``: where and how wide (see ``ray_runner``)."""

    address: str | None = None  # None: start a local Ray instance (unless one is running)
    num_workers: int = 1  # actors, each with its own Engine
    batch_size: int = 64  # records per map_batches call (the engine batches them together)
    cpus_per_worker: float = 1.0


@dataclass
class JobConfig:
    input: Path
    output: Path
    spec: ExtractSpec
    engine_options: dict[str, Any] = field(default_factory=dict)  # Engine(**options)
    overwrite: bool = False
    retry_failed: bool = False
    window: int | None = None  # local runner: requests in flight (default 2 x max_running_requests)
    ray: RayOptions | None = None  # --ray, else the local runner
    progress: bool = True


@dataclass
class JobSummary:
    skipped: int = 0  # records already in the output file
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # error type -> records
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0

    @property
    def done(self) -> int:
        return self.ok + sum(self.failed.values())

    def add(self, result: ExtractResult) -> None:
        if result.ok:
            self.ok += 1
        else:
            assert result.error is not None
            self.failed[result.error.type] += 1
        self.prompt_tokens += result.prompt_tokens
        self.completion_tokens += result.completion_tokens

    def format(self, output: Path) -> str:
        seconds = max(self.seconds, 1e-9)
        failed = sum(self.failed.values())
        reasons = ", ".join(f"{kind} {n}" for kind, n in sorted(self.failed.items()))
        lines = [
            f"{self.done} records in {self.seconds:.1f} s ({self.done / seconds:.2f} records/s): "
            f"{self.ok} ok, {failed} failed" + (f" ({reasons})" if reasons else ""),
            f"{self.completion_tokens} output tokens ({self.completion_tokens / seconds:.1f} tokens/s), {self.prompt_tokens} prompt tokens",
        ]
        if self.skipped:
            lines.append(f"{self.skipped} records already in {output} were skipped")
        return "\n".join(lines)


def run_job(config: JobConfig, engine_factory: EngineFactory) -> JobSummary:
    """Run the job to the end on Engines built by ``engine_factory(**config.engine_options)``;
    ``KeyboardInterrupt`` leaves a resumable output."""
    input_format(config.input)
    if not Path(config.input).is_file():
        raise FileNotFoundError(f"input file {config.input} does not exist")
    config.spec.sampling_params()  # bad sampling fields stop the job before the model loads
    existing = _prepare_output(config)
    total = max(0, count_records(config.input) - len(existing.done))
    summary = JobSummary()
    with _results(config, engine_factory, existing.done, summary) as results, ResultWriter(config.output) as writer:
        start = time.monotonic()  # after the model loaded (the Ray actors load theirs inside)
        bar = _progress(total, config.progress)
        try:
            for result in results:
                writer.write(result)
                summary.add(result)
                elapsed = max(time.monotonic() - start, 1e-9)  # tqdm's own rate turns into s/rec below 1/s
                bar.set_postfix(rec_s=f"{summary.done / elapsed:.2f}", tok_s=f"{summary.completion_tokens / elapsed:.1f}",
                                failed=sum(summary.failed.values()), refresh=False)  # fmt: skip
                bar.update(1)
        finally:
            summary.seconds = time.monotonic() - start
            bar.close()
    return summary


def _prepare_output(config: JobConfig) -> Any:
    if config.overwrite:
        Path(config.output).unlink(missing_ok=True)
    elif config.retry_failed and Path(config.output).exists():
        dropped = drop_failures(config.output)
        _note(f"--retry-failed: removed {dropped} failed lines from {config.output}; those records run again")
    existing = read_existing(config.output)
    if existing.repaired:
        _note(f"{config.output}: {existing.repaired}")
    if existing.lines:
        _note(f"resuming: {existing.lines} results already in {config.output}; their records are skipped")
    return existing


@contextlib.contextmanager
def _results(config: JobConfig, engine_factory: EngineFactory, done: set[str], summary: JobSummary) -> Iterator[Iterator[ExtractResult]]:
    """The results of the records not done yet, from the runner the config names."""
    if config.ray is not None:
        try:
            from .ray_runner import ray_results
        except ImportError as exc:
            raise ValueError(f'--ray needs Ray Data: pip install "formcast[ray]" ({exc})') from None
        summary.skipped = _count_done(config, done)
        yield ray_results(config.input, config.spec, config.engine_options, config.ray, done, engine_factory)
        return
    from .runner import run_records

    _note("loading model...")
    with engine_factory(**config.engine_options) as engine:
        yield run_records(engine, _not_done(config, done, summary), config.spec, window=config.window)


def _not_done(config: JobConfig, done: set[str], summary: JobSummary) -> Iterator[Any]:
    for record in read_records(config.input, config.spec.id_field):
        if id_key(record.id) in done:
            summary.skipped += 1
            continue
        yield record


def _count_done(config: JobConfig, done: set[str]) -> int:
    if not done:
        return 0
    return sum(id_key(r.id) in done for r in read_records(config.input, config.spec.id_field))


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="rec", file=sys.stderr, disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def _note(message: str) -> None:
    print(f"formcast: {message}", file=sys.stderr, flush=True)
