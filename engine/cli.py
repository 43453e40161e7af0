"""Command line: ``formcast generate`` (also ``python -m engine generate``).

    formcast generate --regex '\\d{4}-\\d{2}-\\d{2}' --prompt "When did Apollo 11 land?"
    formcast generate --json-schema schema.json --prompt "A user profile" --max-new-tokens 128
    formcast generate --ebnf 'root ::= "yes" | "no"' --prompt "Is water wet?"

Only the generated text goes to stdout (one line per run, so it pipes cleanly); progress, warnings
and errors go to stderr. Exit status: 0 ok, 2 bad arguments or a bad constraint.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="formcast", description="Constrained generation with the embedded model.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text that matches a regex, JSON Schema or EBNF grammar")
    which = gen.add_mutually_exclusive_group(required=True)
    which.add_argument("--regex", metavar="PATTERN", help="the output must fully match this regex")
    which.add_argument("--json-schema", metavar="FILE_OR_JSON", help="a JSON Schema file, or inline JSON")
    which.add_argument("--ebnf", metavar="FILE_OR_TEXT", help="an EBNF grammar file, or inline text (root ::= ...)")
    gen.add_argument("--prompt", required=True, help="the user message")
    gen.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    gen.add_argument("--model", metavar="PATH", help="a local Hugging Face model folder (default: embedded SmolLM2-135M-Instruct)")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 (default) means greedy")
    gen.add_argument("--top-p", type=float, default=1.0, metavar="P")
    gen.add_argument("--seed", type=int, default=None, metavar="S")
    gen.add_argument("--no-chat", action="store_true", help="use the prompt as raw text, without the chat template")
    gen.add_argument("--threads", type=int, default=None, metavar="K", help="torch CPU threads")
    return parser


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
    return {"ebnf": _file_or_text(args.ebnf)}


def _quiet_libraries() -> None:
    # transformers prints loading bars and generation-config notes; keep stdout for the answer.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("transformers").setLevel(logging.ERROR)


def cmd_generate(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    constraint = _constraint(args)
    _quiet_libraries()
    import torch

    from grammar import TokenVocabulary

    from .hf.processor import Constraint, generate_with_grammars
    from .hf.model_files import load_model_and_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.seed is not None:
        torch.manual_seed(args.seed)
    print("formcast: loading model...", file=sys.stderr, flush=True)
    model, tokenizer = load_model_and_tokenizer(args.model)
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    compiled = Constraint(**constraint).compile(vocab)
    sampling: dict[str, Any] = {"do_sample": args.temperature > 0}
    if sampling["do_sample"]:
        sampling.update(temperature=args.temperature, top_p=args.top_p, top_k=0)
    print("formcast: generating...", file=sys.stderr, flush=True)
    (text,) = generate_with_grammars(
        model, tokenizer, [args.prompt], [compiled], max_new_tokens=args.max_new_tokens, chat=not args.no_chat, **sampling
    )
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return cmd_generate(args)
    except (ValueError, FileNotFoundError) as exc:  # GrammarError is a ValueError
        print(f"formcast: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
