"""Benchmark: a GGUF file run by formcast (weights kept quantized) against llama.cpp, same file, one run.

    python bench/gguf_bench.py [--engines formcast-gguf,formcast-hf,llama.cpp] [--threads 2]
                               [--decode-tokens 64] [--prefill-tokens 512] [--records 24]
                               [--max-new-tokens 128] [--random-1b Q4_0,Q8_0]

The embedded SmolLM2-135M-Instruct: ``formcast-gguf`` loads its Q4_1 GGUF directly (Q4_1
matrices, the Q8_0 embedding used as the head); ``formcast-hf`` runs the fp32 folder converted
from the same file (today's default); ``llama.cpp`` is llama-cpp-python on the same GGUF. Every
engine runs in its own subprocess (so its peak resident memory is its own), with ``--threads``
threads, greedy:

* decode: batch 1, ``--decode-tokens`` new tokens after a short chat prompt, EOS ignored (banned
  for llama.cpp): tokens/s over the generation's wall time;
* prefill: a ``--prefill-tokens`` prompt, one new token: prompt tokens/s;
* json batch 1: one request constrained by ``SCHEMA`` (llama.cpp: its own JSON-schema grammar,
  ``LlamaGrammar.from_json_schema``): output tokens/s;
* schema job: ``--records`` prompts under ``SCHEMA`` with at most ``--max-new-tokens`` tokens
  (formcast: one batched ``generate``; llama.cpp: one request after another): records/s and how
  many outputs validate against the schema;
* peak RSS (``ru_maxrss``) of the engine's process;
* formcast's per-step breakdown over the decode run, from the scheduler's own timing: schedule
  (batch -> tensors), forward, mask wait (the grammar's mask worker), sample (mask applied,
  sampling), process (outputs, finish checks), and other (wall time outside the step loop:
  waiting for the request, handing results to the caller), ms per step.

The bandwidth-bound half of the benchmark: ``--random-1b Q4_0,Q8_0`` writes a random-weight
Llama-shaped model of about 1B parameters (22 layers, hidden 2048, GQA 32/4, the tests' 259-token
byte vocabulary) in each type with ``gguf.quants`` (cached under ``~/.cache/formcast/bench``), and
runs batch-1 decode and a ``--prefill-tokens`` prefill on formcast and on llama.cpp, each in its
own process, plus the share of the memory-bandwidth bound: file bytes per token over the bandwidth of
a 1 GB float32 ``torch.mv`` measured in the same run.

llama.cpp runs with its default CPU buffers (weights repacked where it does that for the type)
unless the installed build has the AMX path, which crashes on some CPUs: then with plain buffers,
a slower anchor. The report's first line says which (``llama.cpp: repacked`` or ``plain``); for a
repacked anchor on an AMX machine, build one with ``bash bench/llama_cpp_noamx.sh`` and put the
directory it prints first on ``PYTHONPATH``.

Ratios are against llama.cpp in the same run. Not collected by pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import machine_line, markdown_table, ratio  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "born": {"type": "integer", "minimum": 1000, "maximum": 2025},
        "fields": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["name", "born", "fields"],
    "additionalProperties": False,
}
PEOPLE = ["Marie Curie", "Alan Turing", "Ada Lovelace", "Isaac Newton", "Rosalind Franklin", "Niels Bohr",
          "Grace Hopper", "Charles Darwin", "Lise Meitner", "Nikola Tesla", "Emmy Noether", "Galileo Galilei",
          "Dorothy Hodgkin", "Michael Faraday", "Barbara McClintock", "Srinivasa Ramanujan", "Katherine Johnson",
          "Gregor Mendel", "Chien-Shiung Wu", "James Clerk Maxwell", "Hedy Lamarr", "Louis Pasteur",
          "Rachel Carson", "Alexander Fleming"]  # fmt: skip
DECODE_PROMPT = "Tell me a long story about a lighthouse keeper."
PHASES = ("schedule", "forward", "mask_wait", "sample", "process")  # the scheduler's own step timing


def _valid(text: str) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except Exception:
        return False


def _record_prompt(name: str) -> str:
    return f"Give me a JSON record about {name}: name, year born, fields of work."


def _peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's ``ru_maxrss`` survives ``exec``, so a child
    started by a parent that had written the 1B files reported the parent's gigabytes; the
    address space's own high-water mark (``VmHWM``) starts afresh with the new program."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------- formcast


def run_formcast(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine import Engine
    from engine.hf.model_files import default_model_dir, gguf_path

    torch.set_num_threads(args.threads)
    path = gguf_path() if kind == "formcast-gguf" else default_model_dir()
    options = {"dtype": "float32"} if kind == "formcast-hf" else {}
    eng = Engine(str(path), num_threads=args.threads, max_total_tokens=8192, max_running_requests=32, **options)
    chat = lambda text: eng.apply_chat_template([{"role": "user", "content": text}])  # noqa: E731
    greedy = {"temperature": 0.0}
    try:
        eng.generate(input_ids=chat("warm up"), sampling_params={**greedy, "max_new_tokens": 8, "json_schema": SCHEMA})
        sched = eng.scheduler
        before, forwards = dict(sched.timing), sched.stats["forwards"]
        t = time.perf_counter()
        out = eng.generate(input_ids=chat(DECODE_PROMPT), sampling_params={**greedy, "max_new_tokens": args.decode_tokens, "ignore_eos": True})
        decode_s = time.perf_counter() - t
        steps = max(sched.stats["forwards"] - forwards, 1)
        breakdown = {f"{k}_ms": 1e3 * (sched.timing[k] - before.get(k, 0.0)) / steps for k in PHASES}
        breakdown["other_ms"] = 1e3 * decode_s / steps - sum(breakdown.values())  # waits between steps, detokenization
        decode = out["meta_info"]["completion_tokens"] / decode_s

        long_ids = (eng.tokenizer.encode(" ".join(["The lighthouse keeper watched the sea."] * 80)))[: args.prefill_tokens]
        t = time.perf_counter()
        eng.generate(input_ids=long_ids, sampling_params={**greedy, "max_new_tokens": 1})
        prefill = len(long_ids) / (time.perf_counter() - t)

        t = time.perf_counter()
        js = eng.generate(input_ids=chat(_record_prompt("Marie Curie")), sampling_params={**greedy, "max_new_tokens": args.max_new_tokens, "json_schema": SCHEMA})
        json_tps = js["meta_info"]["completion_tokens"] / (time.perf_counter() - t)

        prompts = [chat(_record_prompt(p)) for p in PEOPLE[: args.records]]
        t = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params={**greedy, "max_new_tokens": args.max_new_tokens, "json_schema": SCHEMA})
        job_s = time.perf_counter() - t
    finally:
        eng.shutdown()
    return {"decode_tps": decode, "prefill_tps": prefill, "json_tps": json_tps, "records_per_s": len(prompts) / job_s,
            "valid": sum(_valid(o["text"]) for o in outs), "records": len(prompts), "peak_rss_mb": _peak_rss_mb(),
            **breakdown}  # fmt: skip


# --------------------------------------------------------------------------- llama.cpp


def llama_cpp_build() -> str:
    """How the installed llama.cpp runs here: "repacked" (its default CPU buffers), "plain" or
    "absent"."""
    try:
        import llama_cpp
    except ImportError:
        return "absent"

    # Builds with the AMX path segfault on some Sapphire Rapids-class CPUs (llama.cpp issue 20824,
    # seen here on every quantized 1B file): they run with the extra buffer types off, which
    # also turns off repacking, llama.cpp's fast Q4_0 / Q4_K path. bench/llama_cpp_noamx.sh builds
    # one without AMX, which keeps repacking.
    return "plain" if "AMX_INT8 = 1" in llama_cpp.llama_print_system_info().decode() else "repacked"


def _llama(path: str, **options: Any) -> Any:
    """llama.cpp on ``path`` the fastest way this build runs safely (see :func:`llama_cpp_build`)."""
    from llama_cpp import Llama

    if llama_cpp_build() == "repacked":
        return Llama(model_path=path, verbose=False, **options)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import llama_cpp_model

    return llama_cpp_model(path, **options)


def run_llama_cpp(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    from llama_cpp import LlamaGrammar

    from engine.hf.model_files import gguf_path

    llm = _llama(str(gguf_path()), n_ctx=2048, n_batch=512, n_threads=args.threads)
    eos = llm.token_eos()

    def render(text: str) -> str:
        return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"

    def no_eos(_ids: Any, logits: Any) -> Any:
        logits[eos] = -np.inf
        return logits

    llm(render("warm up"), max_tokens=8, temperature=0.0)
    t = time.perf_counter()
    out = llm(render(DECODE_PROMPT), max_tokens=args.decode_tokens, temperature=0.0, logits_processor=[no_eos])
    decode = out["usage"]["completion_tokens"] / (time.perf_counter() - t)

    ids = llm.tokenize(" ".join(["The lighthouse keeper watched the sea."] * 80).encode(), add_bos=False)[: args.prefill_tokens]
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    prefill = len(ids) / (time.perf_counter() - t)

    grammar = LlamaGrammar.from_json_schema(json.dumps(SCHEMA), verbose=False)
    t = time.perf_counter()
    js = llm(render(_record_prompt("Marie Curie")), max_tokens=args.max_new_tokens, temperature=0.0, grammar=grammar)
    json_tps = js["usage"]["completion_tokens"] / (time.perf_counter() - t)

    texts = []
    t = time.perf_counter()
    for person in PEOPLE[: args.records]:
        r = llm(render(_record_prompt(person)), max_tokens=args.max_new_tokens, temperature=0.0, grammar=grammar)
        texts.append(r["choices"][0]["text"])
    job_s = time.perf_counter() - t
    return {"decode_tps": decode, "prefill_tps": prefill, "json_tps": json_tps, "records_per_s": len(texts) / job_s,
            "valid": sum(_valid(x) for x in texts), "records": len(texts), "peak_rss_mb": _peak_rss_mb()}  # fmt: skip


# --------------------------------------------------------------------------- a random 1B model

LLAMA_1B = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                num_key_value_heads=4, max_position_embeddings=2048)  # fmt: skip


def random_1b_file(type_name: str) -> Path:
    """The random Llama-shaped ~1B model as a ``type_name`` GGUF (written once, then cached)."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_files import TINY, write_gguf

    path = Path.home() / ".cache" / "formcast" / "bench" / f"llama-1b-random-{type_name}.gguf"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    c = {**TINY, **LLAMA_1B}
    hidden, ffn, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * hidden // c["num_attention_heads"]
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

    state = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(c["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (kv, hidden)), ("self_attn.v_proj", (kv, hidden)),
                            ("self_attn.o_proj", (hidden, hidden)), ("mlp.gate_proj", (ffn, hidden)), ("mlp.up_proj", (ffn, hidden)),
                            ("mlp.down_proj", (hidden, ffn))):  # fmt: skip
            state[layer + name + ".weight"] = normal(*shape)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[layer + norm + ".weight"] = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    state["model.norm.weight"] = np.ones(hidden, np.float32)
    state["lm_head.weight"] = normal(vocab, hidden)
    partial = path.with_suffix(".partial")
    if type_name.endswith(("_S", "_M", "_L")):  # a llama.cpp file type (a mix, as Q4_K_M): its quantizer writes it
        import llama_cpp

        floats = path.with_suffix(".f32.partial")
        write_gguf(floats, state, config=c)
        del state
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
        params.nthread = 2
        rc = llama_cpp.llama_model_quantize(str(floats).encode(), str(partial).encode(), params)
        floats.unlink()
        assert rc == 0, f"llama_model_quantize failed ({rc})"
    else:
        write_gguf(partial, state, qtype=type_name, config=c)
    partial.rename(path)
    return path


def gemv_bandwidth_gbs(threads: int) -> float:
    """Bytes per second of a 1 GB float32 ``torch.mv`` (best of five): what a bandwidth-bound
    decode step can stream on this machine with ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    matrix, vector = torch.randn(16384, 16384), torch.randn(16384)
    torch.mv(matrix, vector)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        torch.mv(matrix, vector)
        best = min(best, time.perf_counter() - t)
    return matrix.numel() * 4 / best / 1e9


def _byte_prompt(count: int) -> list[int]:
    text = (" ".join(["The lighthouse keeper watched the sea."] * 200)).encode()
    return list(text[:count])  # the tiny vocabulary's first 256 ids are the bytes


def run_formcast_file(path: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from engine import Engine

    torch.set_num_threads(args.threads)
    eng = Engine(path, num_threads=args.threads, max_total_tokens=4096, max_running_requests=4)
    greedy = {"temperature": 0.0, "ignore_eos": True}
    try:
        eng.generate(input_ids=_byte_prompt(16), sampling_params={**greedy, "max_new_tokens": 4})
        t = time.perf_counter()
        out = eng.generate(input_ids=_byte_prompt(24), sampling_params={**greedy, "max_new_tokens": args.decode_tokens})
        decode = out["meta_info"]["completion_tokens"] / (time.perf_counter() - t)
        ids = _byte_prompt(args.prefill_tokens)
        t = time.perf_counter()
        eng.generate(input_ids=ids, sampling_params={**greedy, "max_new_tokens": 1})
        prefill = len(ids) / (time.perf_counter() - t)
    finally:
        eng.shutdown()
    return {"decode_tps": decode, "prefill_tps": prefill, "peak_rss_mb": _peak_rss_mb()}


def run_llama_cpp_file(path: str, args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    from llama_cpp import Llama

    llm = _llama(path, n_ctx=2048, n_batch=512, n_threads=args.threads)
    eos = llm.token_eos()

    def no_eos(_ids: Any, logits: Any) -> Any:
        logits[eos] = -np.inf
        return logits

    llm.create_completion(_byte_prompt(16), max_tokens=4, temperature=0.0, logits_processor=[no_eos])
    t = time.perf_counter()
    out = llm.create_completion(_byte_prompt(24), max_tokens=args.decode_tokens, temperature=0.0, logits_processor=[no_eos])
    decode = out["usage"]["completion_tokens"] / (time.perf_counter() - t)
    ids = _byte_prompt(args.prefill_tokens)
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    prefill = len(ids) / (time.perf_counter() - t)
    return {"decode_tps": decode, "prefill_tps": prefill, "peak_rss_mb": _peak_rss_mb()}


def random_1b_report(args: argparse.Namespace) -> None:
    bandwidth = gemv_bandwidth_gbs(args.threads)
    print(f"# {machine_line()}; {args.threads} threads; random Llama-shaped ~1B models; "
          f"float32 GEMV bandwidth {bandwidth:.1f} GB/s; llama.cpp: {llama_cpp_build()}\n")  # fmt: skip
    rows = []
    for type_name in args.random_1b.split(","):
        path = random_1b_file(type_name)
        size_gb = path.stat().st_size / 1e9
        results = {name: _child(f"{name}={path}", args) for name in ("formcast", "llama.cpp")}
        for name, r in results.items():
            if "error" in r:
                rows.append([type_name, name, r["error"], "", "", "", ""])
                continue
            share = r["decode_tps"] * size_gb / bandwidth
            rows.append([type_name, name, f"{r['decode_tps']:.2f}", f"{share:.0%}", f"{r['prefill_tps']:.1f}", f"{r['peak_rss_mb']:.0f}", f"{size_gb:.2f}"])
        a, b = results["formcast"], results["llama.cpp"]
        if "decode_tps" in a and "decode_tps" in b:
            rows.append([type_name, "formcast / llama.cpp", ratio(a["decode_tps"], b["decode_tps"]), "", ratio(a["prefill_tps"], b["prefill_tps"]), "", ""])
    header = ["type", "engine", "batch-1 decode tok/s", "of the bandwidth bound", f"prefill tok/s ({args.prefill_tokens})", "peak RSS MB", "file GB"]
    print(markdown_table(header, rows))


# --------------------------------------------------------------------------- driver


def _child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, "--threads", str(args.threads), "--decode-tokens", str(args.decode_tokens),
           "--prefill-tokens", str(args.prefill_tokens), "--records", str(args.records), "--max-new-tokens", str(args.max_new_tokens)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "NUMBA_NUM_THREADS": str(args.threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="formcast-gguf,formcast-hf,llama.cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--records", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--random-1b", default="", help="types of the random ~1B model to run instead, e.g. Q4_0,Q8_0 (or a llama.cpp mix: Q4_K_M)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, _, path = args.child.partition("=")
        if path:
            result = run_llama_cpp_file(path, args) if name == "llama.cpp" else run_formcast_file(path, args)
        else:
            result = run_llama_cpp(args) if name == "llama.cpp" else run_formcast(name, args)
        print(json.dumps(result))
        return
    if args.random_1b:
        random_1b_report(args)
        return
    results = {name: _child(name, args) for name in args.engines.split(",")}
    anchor = results.get("llama.cpp", {})
    print(f"# {machine_line()}; {args.threads} threads; SmolLM2-135M-Instruct Q4_1 GGUF; llama.cpp: {llama_cpp_build()}\n")
    metrics = [("batch-1 decode tok/s", "decode_tps"), (f"prefill tok/s ({args.prefill_tokens} tokens)", "prefill_tps"),
               ("JSON schema batch 1 tok/s", "json_tps"), (f"{args.records}-record schema job, records/s", "records_per_s")]  # fmt: skip
    header = ["metric"] + [n for n in results] + [f"{n} / llama.cpp" for n in results if n != "llama.cpp" and anchor]
    rows = []
    for label, key in metrics:
        row = [label] + [f"{r[key]:.2f}" if key in r else r.get("error", "-") for r in results.values()]
        row += [ratio(r.get(key, float("nan")), anchor.get(key, float("nan"))) for n, r in results.items() if n != "llama.cpp" and anchor]
        rows.append(row)
    rows.append(["valid outputs"] + [f"{r['valid']}/{r['records']}" if "valid" in r else "-" for r in results.values()]
                + ["" for n in results if n != "llama.cpp" and anchor])  # fmt: skip
    rows.append(["peak RSS MB"] + [f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else "-" for r in results.values()]
                + ["" for n in results if n != "llama.cpp" and anchor])  # fmt: skip
    print(markdown_table(header, rows))
    steps = [(n, r) for n, r in results.items() if "forward_ms" in r]
    if steps:
        print("\nformcast decode step at batch 1, ms per step (the scheduler's timing; other = wall time outside it):\n")
        cols = PHASES + ("other",)
        print(markdown_table(["engine", *cols], [[n] + [f"{r[c + '_ms']:.2f}" for c in cols] for n, r in steps]))
    for name, r in results.items():
        if "error" in r:
            print(f"\n{name}: {r['error']}")


if __name__ == "__main__":
    main()
