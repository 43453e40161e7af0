"""Hostile and huge constraints, and a runner that compiles one in a child process under a time
and memory limit.

The children are forked from one case server that has imported the compiler and loaded its
kernels (an interpreter start and the imports were most of a case's time); each child is still a
process of its own, so a crash, a hang or a limit ends only that case.

Each case is (kind, source builder). The child compiles the source against a byte-level
vocabulary, fills the first mask, and prints one JSON line: the outcome ("compiled" or the
GrammarError subclass raised), its message and the seconds taken. Anything else (a hang, a
RecursionError, a MemoryError, a crash) is what these cases exist to catch.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

# Each case runs under the default budget with the wall-clock backstop off: every verdict is
# decided by counted work (issue 25), so it is the same on a quiet or a loaded machine. The
# largest cases compile in about 5 s on a quiet 2-core box (BENCHMARKS.md, issue 15).
BUDGET_SECONDS = None
# A child that has used this much CPU time hangs (CPU time, not wall time: the verdict of a case
# must not depend on how many other processes share the machine). The wall-clock kill is only a
# last resort, far beyond it.
CASE_CPU_SECONDS = 120
CASE_SECONDS = 1800.0
CASE_MEMORY_BYTES = 6 << 30


def _words(n: int, prefix: str = "item") -> list[str]:
    # Distinct names that share prefixes the way product names and SKUs do.
    return [f"{prefix}-{i:06d}-{'abcdefghij'[i % 10]}" for i in range(n)]


def _nested_schema(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _nested_array_schema(depth: int) -> dict:
    schema: dict = {"type": "boolean"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def _chained_rules(n: int) -> str:
    lines = [f"root ::= r0"] + [f"r{i} ::= \"x\" r{i + 1}" for i in range(n)] + [f"r{n} ::= \"end\""]
    return "\n".join(lines)


def _alias_rules(n: int) -> str:
    return "\n".join([f"root ::= r0"] + [f"r{i} ::= r{i + 1}" for i in range(n)] + [f"r{n} ::= \"end\""])


def _many_properties(n: int, extra_keys: bool = False) -> dict:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}, "required": [f"p{i}" for i in range(n)]}
    return schema if extra_keys else {**schema, "additionalProperties": False}


CASES: dict[str, tuple[str, Callable[[], object]]] = {
    # Huge alternatives
    "enum_100k_strings": ("json_schema", lambda: {"enum": _words(100_000)}),
    "enum_10k_mixed": ("json_schema", lambda: {"enum": _words(5_000) + list(range(5_000))}),
    "regex_alternation_20k": ("regex", lambda: "(" + "|".join(_words(20_000)) + ")"),
    "ebnf_alternation_20k": ("ebnf", lambda: "root ::= " + " | ".join(json.dumps(w) for w in _words(20_000))),
    # Long sequences
    "properties_5000_required": ("json_schema", lambda: _many_properties(5_000)),
    "properties_5000_required_extra_keys": ("json_schema", lambda: _many_properties(5_000, extra_keys=True)),
    "regex_counted_any_100k": ("regex", lambda: r"[\s\S]{100000}"),
    "regex_literal_1mb": ("regex", lambda: "a" * (1 << 20)),
    "regex_counted_nested": ("regex", lambda: r"((a{1000}){1000}){1000}"),
    "schema_max_length_1e9": ("json_schema", lambda: {"type": "string", "minLength": 1_000_000_000}),
    "schema_min_items_1e9": ("json_schema", lambda: {"type": "array", "minItems": 1_000_000_000}),
    "schema_const_1mb": ("json_schema", lambda: {"const": "x" * (1 << 20)}),
    # Deep nesting
    "schema_nested_2000": ("json_schema", lambda: _nested_schema(2_000)),
    "schema_nested_arrays_5000": ("json_schema", lambda: _nested_array_schema(5_000)),
    "schema_ref_chain_5000": ("json_schema", lambda: _ref_chain(5_000)),
    "schema_ref_cycle": ("json_schema", lambda: {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
    "regex_nested_groups_5000": ("regex", lambda: "(" * 5_000 + "a" + ")" * 5_000),
    "ebnf_chained_rules_20k": ("ebnf", lambda: _chained_rules(20_000)),
    "ebnf_alias_rules_20k": ("ebnf", lambda: _alias_rules(20_000)),
    "ebnf_nested_parens_5000": ("ebnf", lambda: "root ::= " + "(" * 5_000 + "\"a\"" + ")" * 5_000),
    "lark_nested_parens_3000": ("lark", lambda: "start: " + "(" * 3_000 + "\"a\"" + ")" * 3_000),
    # Numbers
    "multiple_of_1e-300": ("json_schema", lambda: {"type": "number", "multipleOf": 1e-300, "minimum": 0, "maximum": 1}),
    "multiple_of_tiny_integer_range": ("json_schema", lambda: {"type": "integer", "multipleOf": 7, "minimum": -1e300, "maximum": 1e300}),
    "number_bounds_1e308": ("json_schema", lambda: {"type": "number", "minimum": -1.7e308, "maximum": 1.7e308, "exclusiveMinimum": 1e-308}),
    # Catastrophic-backtracking regexes (a backtracking engine takes exponential time on them)
    "regex_evil_nested_star": ("regex", lambda: r"(a*)*b"),
    "regex_evil_alternation": ("regex", lambda: r"(a|aa)+$"),
    "regex_evil_counted": ("regex", lambda: r"(a|a?){30}a{30}"),
    "regex_state_explosion": ("regex", lambda: r"[ab]*a[ab]{20}"),
    # Garbage
    "schema_garbage_text": ("json_schema", lambda: "{\"type\": \"obj"),
    "schema_not_a_schema": ("json_schema", lambda: "[1, 2, 3]"),
    "regex_garbage": ("regex", lambda: "(((((a[b-"),
    "ebnf_garbage": ("ebnf", lambda: "root ::= (\"a\" | \n ::= ::= \x00"),
    "lark_garbage": ("lark", lambda: "start: ( /unclosed"),
    "ebnf_binary": ("ebnf", lambda: bytes(range(256)).decode("latin-1") * 20),
}


def _segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def _spin() -> None:
    while True:
        pass


# Not constraints: what a broken compiler could do, for the test that the runner reports it.
RUNNER_CHECKS: dict[str, Callable[[], None]] = {"runner_check_segfault": _segfault, "runner_check_spin": _spin}


@dataclass(frozen=True)
class CaseResult:
    name: str
    outcome: str  # "compiled", a GrammarError subclass name, or "timeout" / "crash: ..."
    message: str
    seconds: float
    steps: int = -1  # compile steps counted (compiled cases): the same on every machine


def run_case(name: str, timeout: float = CASE_SECONDS, cpu_seconds: int = CASE_CPU_SECONDS) -> CaseResult:
    """Compile case ``name`` in a child process; never raises for what the child does."""
    start = time.monotonic()
    try:
        reply = _case_server().ask(name, timeout, cpu_seconds)
    except TimeoutError:
        return CaseResult(name, "timeout", f"no answer within {timeout:g} s", time.monotonic() - start)
    status, line, stderr = reply["status"], reply["line"], reply["stderr"]
    if status == -signal.SIGXCPU:
        return CaseResult(name, "timeout", f"no answer within {cpu_seconds} s of CPU time", time.monotonic() - start)
    if status != 0 or not line:
        return CaseResult(name, f"crash: exit {status}", stderr[-2000:], time.monotonic() - start)
    data = json.loads(line)
    return CaseResult(name, data["outcome"], data["message"], data["seconds"], data.get("steps", -1))


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _CaseServer:
    """One process that imports the compiler and loads its kernels once, then forks a fresh child
    per case: a child costs a fork instead of an interpreter start and 1 to 2 s of imports, and a
    crash, a hang or a limit still ends only that child."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=_ROOT,
        )  # fmt: skip
        atexit.register(self.close)

    def ask(self, name: str, timeout: float, cpu_seconds: int) -> dict:
        self.proc.stdin.write(json.dumps({"name": name, "timeout": timeout, "cpu_seconds": cpu_seconds}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the case server exited with {self.proc.wait()}")
        reply = json.loads(line)
        if reply.get("timeout"):
            raise TimeoutError(name)
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_SERVER: _CaseServer | None = None


def _case_server() -> _CaseServer:
    global _SERVER
    if _SERVER is None or _SERVER.proc.poll() is not None:
        _SERVER = _CaseServer()
    return _SERVER


def _child(name: str, cpu_seconds: int = CASE_CPU_SECONDS) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CASE_MEMORY_BYTES, CASE_MEMORY_BYTES))
    # SIGXCPU at the soft limit (reported as a timeout); SIGKILL only if the child outlives it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 10))
    from grammar import CompileBudget, GrammarError, TokenVocabulary, api

    # Byte-level tokens: the budgets under test are the compiler's; a real vocabulary would add
    # seconds of tokenizer loading to every case (its masks are tested in test_hostile_inputs).
    vocab = TokenVocabulary.byte_level()
    if name in RUNNER_CHECKS:
        RUNNER_CHECKS[name]()
    kind, build = CASES[name]
    source = build()
    compile_fn = {"json_schema": api.compile_json_schema, "regex": api.compile_regex, "ebnf": api.compile_ebnf, "lark": api.compile_lark}[kind]
    start = time.monotonic()
    try:
        compiled = compile_fn(source, vocab, budget=CompileBudget(max_compile_seconds=BUDGET_SECONDS))
        compiled.token_mask(compiled.initial_state)
        outcome, message, steps = "compiled", "", compiled.compile_steps
    except GrammarError as exc:
        outcome, message, steps = type(exc).__name__, str(exc)[:500], -1
    print(json.dumps({"outcome": outcome, "message": message, "seconds": time.monotonic() - start, "steps": steps}), flush=True)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's wait status, or None after killing it at the wall-clock backstop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _serve() -> None:
    """The case server's loop: one request line in, one reply line out, a forked child between."""
    import tempfile

    from grammar import TokenVocabulary, api

    # Loads the compiled kernels (numba reads its cache on first call) once for every child.
    api.compile_regex("[a-z]{1,3}", TokenVocabulary.byte_level()).token_mask(0)
    api.clear_cache()  # each child starts with no compiled grammar, as a fresh interpreter would
    for request in sys.stdin:
        ask = json.loads(request)
        with tempfile.TemporaryFile("w+b") as out, tempfile.TemporaryFile("w+b") as err:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:  # the child: its own stdout and stderr, never back into this loop
                code = 0
                try:
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    _child(ask["name"], ask["cpu_seconds"])
                except BaseException:
                    import traceback

                    traceback.print_exc()
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            status = _wait(pid, ask["timeout"])
            if status is None:
                print(json.dumps({"timeout": True}), flush=True)
                continue
            out.seek(0)
            err.seek(0)
            lines = [x for x in out.read().decode("utf-8", "replace").splitlines() if x.startswith("{")]
            reply = {"status": os.waitstatus_to_exitcode(status), "line": lines[-1] if lines else "", "stderr": err.read().decode("utf-8", "replace")}
            print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, _ROOT)
    if sys.argv[1] == "--serve":
        _serve()
    else:
        _child(sys.argv[1])
