"""Command line: ``formcast generate``, ``formcast extract`` and ``formcast serve`` (also
``python -m engine ...``).

    formcast generate --regex '\\d{4}-\\d{2}-\\d{2}' --prompt "When did Apollo 11 land?"
    formcast generate --json-schema schema.json --prompt "A user profile" --max-new-tokens 128
    formcast generate --ebnf 'root ::= "yes" | "no"' --prompt "Is water wet?"
    formcast generate --json-schema schema.json --batch prompts.jsonl > results.jsonl

With ``--prompt``, only the generated text goes to stdout (one line, so it pipes cleanly). With
``--batch FILE.jsonl`` every line is ``{"prompt": ..., "id"?: ..., <sampling fields>?}`` (a line's
own ``json_schema`` / ``regex`` / ``ebnf`` replaces the command line's); all lines run as one
batch and one JSON result per line goes to stdout in input order, with a progress bar on stderr.
Exit status: 0 ok, 1 some batch line failed, 2 bad arguments or a bad constraint.

    formcast extract --input records.jsonl --output out.jsonl --schema schema.json \\
        --prompt-template "Extract the person: {text}" [--ray --num-workers 2] [engine options]

runs a batch job over every record of a JSON-lines, CSV or Parquet file (``engine/extract/``):
one JSON result line per record, appended as records finish; rerun the same command after a kill
and it goes on where it stopped. Exit status: 0 every record ok, 1 some failed (their lines say
why), 2 bad arguments, 130 interrupted.

    formcast serve [--model PATH] [--host 127.0.0.1] [--port 30000] [--api-key KEY] [engine options]

starts the OpenAI-compatible server (``http_server.py``). Its engine options are ``EngineArgs``'
fields, spelt with dashes (``--max-total-tokens``, ``--max-waiting-requests``, ``--dtype``, ...),
so a new engine option appears here without touching this file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .engine_args import EngineArgs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="formcast", description="Constrained generation with formcast's engine.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text that matches a regex, JSON Schema or EBNF grammar")
    which = gen.add_mutually_exclusive_group()
    which.add_argument("--regex", metavar="PATTERN", help="the output must fully match this regex")
    which.add_argument("--json-schema", metavar="FILE_OR_JSON", help="a JSON Schema file, or inline JSON")
    which.add_argument("--ebnf", metavar="FILE_OR_TEXT", help="an EBNF grammar file, or inline text (root ::= ...)")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the user message")
    source.add_argument("--batch", metavar="FILE.jsonl", help="one JSON object per line with a 'prompt'")
    gen.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    gen.add_argument("--json-whitespace", choices=("any", "compact", "pretty"), default="any", help="JSON layout of --json-schema output: any (default; bounded free whitespace), compact (none) or pretty (indent 2); compact and pretty make separators forced text (faster)")
    gen.add_argument("--model", metavar="PATH", help="a local Hugging Face model folder or a .gguf file (default: embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--dtype", default="auto", help="auto (default), float32, bfloat16 or float16")
    gen.add_argument("--quantization", choices=("int8", "int4"), help="weight-only quantization of a Hugging Face folder at load (CPU)")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 (default) means greedy")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P")
    gen.add_argument("--top-k", type=int, default=-1, metavar="K")
    gen.add_argument("--seed", type=int, default=None, metavar="S")
    gen.add_argument("--no-chat", action="store_true", help="use the prompt as raw text, without the chat template")
    gen.add_argument("--threads", type=int, default=None, metavar="K", help="torch CPU threads")
    _add_serve_parser(sub)
    _add_extract_parser(sub)
    pre = sub.add_parser("precompile", help="compile constraints into the on-disk grammar cache, ahead of traffic")
    pre.add_argument("file", metavar="FILE", help="a JSON Schema (.json), a JSON list, or JSONL: one constraint a line "
                     "({\"json_schema\": ...}, {\"regex\": ...}, {\"ebnf\": ...}, or a bare schema)")
    pre.add_argument("--model", metavar="PATH", help="the model whose tokenizer the grammars are for (default: embedded SmolLM2)")
    pre.add_argument("--cache-dir", metavar="DIR", default="default", help="the grammar cache (default: $FORMCAST_CACHE/grammars)")
    return parser


_CONSTRAINT_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


def _read_constraints(path: str) -> list[dict]:
    text = Path(path).read_text()
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [item if isinstance(item, dict) and any(k in item for k in _CONSTRAINT_KEYS) else {"json_schema": item} for item in items]


def cmd_precompile(args: argparse.Namespace) -> int:
    items = _read_constraints(args.file)
    _quiet_libraries()
    from grammar import TokenVocabulary

    from ..constrained.grammar_backend import GrammarBackend
    from ..hf.model_files import default_model_path
    from .engine import grammar_disk_cache, load_tokenizer

    disk = grammar_disk_cache(EngineArgs(grammar_cache_dir=args.cache_dir))
    if disk is None:
        raise ValueError("--cache-dir: the grammar cache is off (FORMCAST_GRAMMAR_CACHE=off); nothing to precompile into")
    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(args.model or default_model_path()))
    backend = GrammarBackend(vocab, disk=disk)
    try:
        refused = 0
        for i, error in enumerate(backend.precompile(items)):
            refused += error is not None
            print(f"{i}: {'compiled' if error is None else 'refused: ' + error}")
    finally:
        backend.shutdown()
    print(f"formcast: {len(items) - refused} of {len(items)} constraints in {disk.directory}", file=sys.stderr)
    return 1 if refused else 0


def _add_extract_parser(sub: Any) -> None:
    ext = sub.add_parser("extract", help="run a constrained extraction over every record of a file (resumable)")
    ext.add_argument("--input", required=True, metavar="FILE", help="records: .jsonl, .csv or .parquet")
    ext.add_argument("--output", required=True, metavar="FILE.jsonl", help="results, one JSON line per record (appended)")
    which = ext.add_mutually_exclusive_group()
    which.add_argument("--schema", "--json-schema", dest="json_schema", metavar="FILE_OR_JSON", help="a JSON Schema file, or inline JSON")
    which.add_argument("--regex", metavar="PATTERN", help="the output must fully match this regex")
    which.add_argument("--ebnf", metavar="FILE_OR_TEXT", help="an EBNF grammar file, or inline text (root ::= ...)")
    ext.add_argument("--prompt-template", default="{text}", metavar="TEXT_OR_FILE", help="str.format text over the record's fields; {text} is --field (default: '{text}')")
    ext.add_argument("--field", default="text", help="the record field holding the document (default: text)")
    ext.add_argument("--id-field", default="id", help="the record field holding its id (default: id; absent: the line number)")
    ext.add_argument("--no-chat", action="store_true", help="use the prompt as raw text, without the chat template")
    ext.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    ext.add_argument("--json-whitespace", choices=("any", "compact", "pretty"), default="any", help="JSON layout of --json-schema output: any (default; bounded free whitespace), compact (none) or pretty (indent 2); compact and pretty make separators forced text (faster)")
    ext.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 (default) means greedy")
    ext.add_argument("--top-p", type=float, default=1.0, metavar="P")
    ext.add_argument("--top-k", type=int, default=-1, metavar="K")
    ext.add_argument("--seed", type=int, default=None, metavar="S", help="with sampling: each record's seed derives from S and its id")
    resume = ext.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true", default=True, help="skip the records already in --output (the default)")
    resume.add_argument("--overwrite", action="store_true", help="empty --output first")
    ext.add_argument("--retry-failed", action="store_true", help="remove the failed lines from --output first, so those records run again")
    ext.add_argument("--window", type=int, default=None, metavar="N", help="records in flight (default: 2 x --max-running-requests)")
    ext.add_argument("--no-progress", action="store_true", help="no progress bar")
    ray = ext.add_argument_group("Ray (pip install formcast[ray])")
    ray.add_argument("--ray", action="store_true", help="run through Ray Data: an actor pool, one Engine per actor")
    ray.add_argument("--ray-address", default=None, metavar="ADDR", help="an existing cluster ('auto', 'ray://host:10001'); default: a local instance")
    ray.add_argument("--num-workers", type=int, default=1, metavar="N", help="actors, each with its own Engine (default 1)")
    ray.add_argument("--batch-size", type=int, default=64, metavar="N", help="records per actor call (default 64)")
    ray.add_argument("--cpus-per-worker", type=float, default=1.0, metavar="C", help="CPUs each actor reserves (and torch threads; default 1)")
    ext.add_argument("--model", metavar="PATH", help="a local Hugging Face model folder or a .gguf file (default: embedded SmolLM2-135M-Instruct)")
    _add_engine_options(ext)


def cmd_extract(args: argparse.Namespace) -> int:
    import signal

    from ..extract.job import JobConfig, RayOptions, run_job
    from .engine import Engine
    from ..extract.spec import ExtractSpec

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    for name in ("num_workers", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    sampling: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p}
    if args.top_k != -1:
        sampling["top_k"] = args.top_k
    if args.seed is not None:
        sampling["sampling_seed"] = args.seed
    if args.json_whitespace != "any":
        sampling["json_whitespace"] = args.json_whitespace
    spec = ExtractSpec(_constraint(args), _file_or_text(args.prompt_template), args.field, args.id_field, not args.no_chat, sampling)
    options = _engine_options(args)
    ray_options = RayOptions(args.ray_address, args.num_workers, args.batch_size, args.cpus_per_worker) if args.ray else None
    config = JobConfig(Path(args.input), Path(args.output), spec, options, overwrite=args.overwrite,
                       retry_failed=args.retry_failed, window=args.window, ray=ray_options, progress=not args.no_progress)  # fmt: skip
    _quiet_libraries()
    # SIGTERM unwinds like Ctrl-C: in-flight requests are aborted, the output is flushed and closed.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        summary = run_job(config, Engine)
    except KeyboardInterrupt:
        print(f"formcast: interrupted; {args.output} holds every finished record: rerun the same command to go on", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("formcast: " + summary.format(config.output).replace("\n", "\nformcast: "), file=sys.stderr)
    return 1 if summary.failed else 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Every ``EngineArgs`` field as ``--name-with-dashes`` (stored as ``engine_<name>``)."""
    engine_opts = parser.add_argument_group("engine options")
    for f in dataclasses.fields(EngineArgs):
        if f.name == "model_path":
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type)
        if kind == "bool":
            engine_opts.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, dest=f"engine_{f.name}")
        else:
            convert = int if kind.startswith("int") else float if kind.startswith("float") else str
            engine_opts.add_argument(flag, type=convert, default=f.default, dest=f"engine_{f.name}", metavar=f.name.upper())


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """``Engine(**options)`` from the parsed engine options; bad ones raise before the model loads."""
    options = {k[len("engine_") :]: v for k, v in vars(args).items() if k.startswith("engine_")}
    options["model_path"] = args.model
    EngineArgs.from_options(**options)
    return options


def _add_serve_parser(sub: Any) -> None:
    serve = sub.add_parser("serve", help="start the OpenAI-compatible HTTP server")
    serve.add_argument("--model", metavar="PATH", help="a local Hugging Face model folder or a .gguf file (default: embedded SmolLM2-135M-Instruct)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--api-key", default=os.environ.get("FORMCAST_API_KEY"), help="require 'Authorization: Bearer KEY' on /v1 (default: $FORMCAST_API_KEY)")
    serve.add_argument("--served-model-name", metavar="NAME", help="the model id clients send (default: the model folder's name)")
    serve.add_argument("--shutdown-timeout", type=float, default=20.0, metavar="S", help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    serve.add_argument("--max-request-body-mb", type=float, default=8.0, metavar="MB", help="larger request bodies get 413 (default 8)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("--no-access-log", action="store_true")
    _add_engine_options(serve)


def cmd_serve(args: argparse.Namespace) -> int:
    _quiet_libraries()
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from .http_server import ServerSettings, run_server

    options = _engine_options(args)  # bad engine options exit 2 before the model loads
    settings = ServerSettings(
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        served_model_name=args.served_model_name,
        shutdown_timeout=args.shutdown_timeout,
        max_request_body_bytes=int(args.max_request_body_mb * 1024 * 1024),
        log_level=args.log_level,
        access_log=not args.no_access_log,
    )
    print("formcast: loading model...", file=sys.stderr, flush=True)
    try:
        run_server(settings, options)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, after its clean shutdown
        pass
    return 0


def _file_or_text(value: str) -> str:
    """A path to an existing file means its content; anything else is the text itself."""
    if len(value) < 4096 and "\n" not in value:
        try:
            path = Path(value)
            if path.is_file():
                return path.read_text(encoding="utf-8")
        except OSError:
            pass
    return value


def _json_schema(value: str) -> Any:
    text = _file_or_text(value)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--json-schema is neither a readable file nor valid JSON: {exc}") from None


def _constraint(args: argparse.Namespace) -> dict[str, Any]:
    if args.regex is not None:
        return {"regex": args.regex}
    if args.json_schema is not None:
        return {"json_schema": _json_schema(args.json_schema)}
    if args.ebnf is not None:
        return {"ebnf": _file_or_text(args.ebnf)}
    return {}


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    params: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p}
    if args.top_k != -1:
        params["top_k"] = args.top_k
    if args.seed is not None:
        params["sampling_seed"] = args.seed
    if args.json_whitespace != "any":
        params["json_whitespace"] = args.json_whitespace
    return {**params, **_constraint(args)}


def _read_batch(path: str) -> list[dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise ValueError(f"{path}:{number}: each line must be an object with a string 'prompt'")
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def cmd_generate(args: argparse.Namespace) -> int:
    base = _sampling(args)
    records = _read_batch(args.batch) if args.batch else [{"prompt": args.prompt}]
    _quiet_libraries()
    from ..entrypoints.engine import Engine

    print("formcast: loading model...", file=sys.stderr, flush=True)
    with Engine(args.model, dtype=args.dtype, num_threads=args.threads, quantization=args.quantization) as engine:
        prompts, params = [], []
        for record in records:
            own = {k: v for k, v in record.items() if k not in ("prompt", "id")}
            if any(k in own for k in ("json_schema", "regex", "ebnf", "structural_tag")):
                merged = {k: v for k, v in base.items() if k not in ("json_schema", "regex", "ebnf")}
            else:
                merged = dict(base)
            merged.update(own)
            text = record["prompt"]
            prompts.append(text if args.no_chat else engine.apply_chat_template([{"role": "user", "content": text}]))
            params.append(merged)
        if args.prompt is not None:
            from ..constrained.output_budget import check_output_budget
            from ..sampling_params import SamplingParams

            one = SamplingParams(**params[0])
            compiled = engine.grammar_backend.compile(one)  # a refused constraint exits 2 here
            check_output_budget(compiled, one, engine.tokenizer)  # so does a budget no output fits
            print("formcast: generating...", file=sys.stderr, flush=True)
            result = engine.generate(prompts[0], params[0])
            _warn_if_not_complete(result)
            sys.stdout.write(result["text"] + "\n")
            return 0
        return _run_batch(engine, records, prompts, params)


def _warn_if_not_complete(result: dict) -> None:
    reason = result["meta_info"]["finish_reason"]
    if reason and reason["type"] != "stop":
        print(f"formcast: warning: finished by {reason}", file=sys.stderr)


def _run_batch(engine: Any, records: list[dict], prompts: list, params: list) -> int:
    from tqdm import tqdm

    rids = [f"line-{i}" for i in range(len(records))]
    texts: dict[str, list[str]] = {rid: [] for rid in rids}
    finals: dict[str, dict] = {}
    with tqdm(total=len(records), unit="req", file=sys.stderr) as bar:
        for chunk in engine.generate(prompts, params, stream=True, rid=rids):
            meta = chunk["meta_info"]
            texts[meta["id"]].append(chunk["text"])
            if meta["finish_reason"] is not None:
                finals[meta["id"]] = meta
                bar.update(1)
    failed = 0
    for record, rid in zip(records, rids):
        meta = finals[rid]
        failed += meta["finish_reason"]["type"] in ("abort", "dead_end")
        line = {"id": record.get("id"), "text": "".join(texts[rid]), "finish_reason": meta["finish_reason"],
                "completion_tokens": meta["completion_tokens"]}  # fmt: skip
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"serve": cmd_serve, "extract": cmd_extract, "generate": cmd_generate, "precompile": cmd_precompile}
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as exc:  # GrammarError and bad sampling params are ValueErrors
        print(f"formcast: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
