"""Benchmark and checks on a CUDA GPU (run where one is available; nothing here runs in CI).

    python bench/gpu_bench.py [--tokenizer DIR] [--quick]

1. Token bitmask apply: formcast's Triton kernel against XGrammar's Triton kernel (ratios).
2. Paged decode attention: formcast's Triton kernel against the gather + SDPA path, checked for
   equality first, at several batch sizes and context mixes, for a SmolLM2-like and a
   Llama-3-8B-like head layout.
3. ModelRunner on CUDA: tiny random Llama (llama3 RoPE) and Qwen2 (bias) against transformers on
   the same weights (fp32 logits within 1e-4, prefill then mixed decode steps).
4. The Engine on CUDA with a random ~1B Llama-shaped model and the embedded model's tokenizer
   (``--tokenizer``): a JSON-schema request must come back schema-valid; decode step time of
   formcast's ModelRunner against transformers at batch 1 and 32 (bf16).
5. GGUF block formats on CUDA (``gguf``): the same model's decode step with its matrices kept as
   ``BlockMatrix``es of each type against bf16, CUDA graphs off and on.
6. CUDA graphs (``graphs``): the random 1B Llama-shaped bf16 model's decode step at batch 1, 8
   and 32, eager against replayed graphs (``engine/model_executor/cuda_graph_runner.py``), and
   the largest logit difference between the two on the same step.

``--only a,b`` runs the named sections (bitmask, attention, runner, engine, gguf, graphs).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def cuda_time_ms(fn, reps: int = 20) -> float:
    """Best of 3 rounds of ``reps`` calls, CUDA events, after one warm-up call (ms a call)."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def bench_decode_attention(quick: bool) -> None:
    from engine.layers.attention import TorchAttention
    from engine.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
    from engine.model_executor.forward_batch import ForwardBatch, ForwardInput

    print("\n## Paged decode attention, CUDA (ms per layer call)\n")
    print("| heads/kv/dim | dtype | batch | contexts | triton ms | gather+SDPA ms | SDPA/triton | max abs diff |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    layouts = [(9, 3, 64), (32, 8, 128)]
    mixes = {"64-1024": (64, 1024), "1024-8192": (1024, 8192)}
    for heads, kv, dim in layouts:
        for dtype in (torch.bfloat16, torch.float32):
            for batch in (1, 8, 32) if quick else (1, 8, 32, 128):
                for name, (lo, hi) in mixes.items():
                    rng = random.Random(batch)
                    lens = [rng.randint(lo, hi) for _ in range(batch)]
                    total = sum(lens) + batch
                    pool = TokenToKVPool(total + 8, 1, kv, dim, dtype, "cuda")
                    reqs = ReqToTokenPool(batch, max(lens) + 2, "cuda")
                    locs = pool.alloc(total + 8)[torch.randperm(total + 8, device="cuda")][:total]
                    pool.k_buffer[0, locs] = torch.randn(total, kv, dim, device="cuda", dtype=dtype)
                    pool.v_buffer[0, locs] = torch.randn(total, kv, dim, device="cuda", dtype=dtype)
                    inputs, used = [], 0
                    for r, n in enumerate(lens):
                        reqs.write(r, 0, locs[used : used + n])
                        inputs.append(ForwardInput(r, n, [1], locs[used + n : used + n + 1]))
                        used += n + 1
                    fb = ForwardBatch.init_new(inputs, reqs, pool)
                    q = torch.randn(batch, heads, dim, device="cuda", dtype=dtype)
                    k = torch.randn(batch, kv, dim, device="cuda", dtype=dtype)
                    v = torch.randn(batch, kv, dim, device="cuda", dtype=dtype)
                    outs, times = [], []
                    for paged in (True, False):
                        backend = TorchAttention(use_paged_kernel=paged)
                        fb.attn_metadata = backend.init_forward_metadata(fb)
                        outs.append(backend.forward(q, k, v, 0, fb))
                        times.append(cuda_time_ms(lambda: backend.forward(q, k, v, 0, fb), reps=5 if hi > 4096 else 20))
                    diff = (outs[0].float() - outs[1].float()).abs().max().item()
                    print(f"| {heads}/{kv}/{dim} | {str(dtype)[6:]} | {batch} | {name} | {times[0]:.3f} | {times[1]:.3f} | {times[1] / times[0]:.1f}x | {diff:.1e} |", flush=True)
                    del pool


def check_runner_vs_transformers() -> None:
    import transformers as tf

    from engine.model_executor.model_runner import ModelRunner
    from model_loop import GreedyLoop

    print("\n## ModelRunner on CUDA against transformers (fp32 logits)\n")
    configs = {
        "llama3-rope": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
    }  # fmt: skip
    for name, (cfg_cls, model_cls, extra) in configs.items():
        folder = Path(tempfile.mkdtemp())
        torch.manual_seed(0)
        cfg = cfg_cls(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.08, **extra)  # fmt: skip
        model_cls(cfg).save_pretrained(str(folder))
        hf = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).cuda().eval()
        runner = ModelRunner(folder, dtype="float32", device="cuda", max_total_tokens=2048, max_running_requests=8)
        loop = GreedyLoop(runner)
        rows = [loop.add([rng % 300 + 3 for rng in range(n, 2 * n)]) for n in (5, 17, 40)]
        worst = 0.0
        logits = loop.step(rows)
        for step in range(8):
            for row, lg in zip(rows, logits):
                with torch.no_grad():
                    ref = hf(torch.tensor([row.tokens], device="cuda")).logits[0, -1].float()
                worst = max(worst, (ref - lg).abs().max().item())
            for row, tok in zip(rows, logits.argmax(-1).tolist()):
                row.tokens.append(tok)
            logits = loop.step(rows)
        print(f"{name}: max |logit diff| over prefill + 8 decode steps = {worst:.2e} ({'ok' if worst < 1e-4 else 'FAIL'})", flush=True)
        shutil.rmtree(folder)


def engine_and_decode_speed(tokenizer_dir: Path | None, quick: bool) -> None:
    import transformers as tf

    from engine import Engine
    from engine.model_executor.model_runner import ModelRunner
    from forward_bench import formcast_run, hf_run, contexts

    folder = Path(tempfile.mkdtemp())
    _random_llama_1b(folder)
    print("\n## Decode step on CUDA, random 1B Llama-shaped model, bf16 (ms per step)\n")
    print("| batch | avg ctx | formcast | transformers | formcast/transformers |")
    print("|---:|---:|---:|---:|---:|")
    runner = ModelRunner(folder, dtype="bfloat16", device="cuda", max_total_tokens=80_000, max_running_requests=64)
    hf = tf.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).cuda().eval()
    for batch in (1, 32):
        prompts = contexts(batch, seed=batch)
        formcast_run(runner, contexts(2, 9), 2)
        ours = formcast_run(runner, prompts, 8)
        theirs = hf_run(hf, [[t % 49000 for t in p] for p in prompts], 8, pad_id=0)
        print(f"| {batch} | {sum(map(len, prompts)) // batch} | {ours[1]:.1f} | {theirs[1]:.1f} | {ours[1] / theirs[1]:.2f}x |", flush=True)
    del runner, hf
    torch.cuda.empty_cache()
    if tokenizer_dir is None:
        return
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy(f, folder / f.name)
    import jsonschema

    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}, "required": ["id", "tags"]}
    with Engine(str(folder), dtype="bfloat16", device="cuda", max_total_tokens=20_000) as engine:
        outs = engine.generate(["A record:"] * 8, {"json_schema": schema, "max_new_tokens": 64, "temperature": 1.0, "sampling_seed": 1})
        good = 0
        for out in outs:
            if out["meta_info"]["finish_reason"]["type"] == "stop":
                jsonschema.validate(json.loads(out["text"]), schema)
                good += 1
        print(f"\nEngine on CUDA (random weights, sampled, budget-aware): {good}/8 outputs finished and validate; "
              f"finish reasons {[o['meta_info']['finish_reason']['type'] for o in outs]}", flush=True)  # fmt: skip
    shutil.rmtree(folder)


# Byte offsets of each ggml type's fp16 scales in a block (sizes: ``ggml_blocks.FORMATS``).
FP16_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_block_bytes(type_name: str, n: int, k: int, device: str = "cuda", seed: int = 0) -> torch.Tensor:
    """A random [n, K] matrix's bytes in a ggml block format (uint8 [n, row_bytes]): random codes
    and sub-scales, every fp16 scale drawn from [1e-3, 1e-2] (random bytes there could be inf/NaN)."""
    from formcast_kernels.ggml_blocks import FORMATS

    elements, size = FORMATS[type_name][:2]
    scales = FP16_AT[type_name]
    g = torch.Generator(device=device).manual_seed(seed)
    raw = torch.randint(0, 256, (n, k // elements, size), dtype=torch.uint8, device=device, generator=g)
    for off in scales:
        d = torch.empty(n, k // elements, device=device).uniform_(1e-3, 1e-2, generator=g).to(torch.float16)
        raw[..., off : off + 2] = d.view(torch.uint8).reshape(n, k // elements, 2)
    return raw.reshape(n, -1)


def gguf_decode_speed(quick: bool) -> None:
    """Decode steps of the random 1B Llama-shaped model with its matrices kept in ggml block formats
    (``BlockMatrix``, random blocks of each matrix's shape) against the same model in bf16, CUDA
    graphs on and off, and the share of the memory-bandwidth bound (weight bytes a step over the
    H200's ~4.3 TB/s measured copy rate)."""
    from engine.model_executor.model_runner import ModelRunner
    from engine.models.loader import load_model
    from engine.models.weight_quantization import matrix_slots, replace_matrix
    from formcast_kernels.ggml_blocks import BlockMatrix
    from forward_bench import contexts, formcast_run

    folder = Path(tempfile.mkdtemp())
    _random_llama_1b(folder)
    print("\n## GGUF block formats on CUDA: decode step, random 1B Llama-shaped model (ms per step)\n")
    print("| weights | weight MB | graphs | batch 1 | batch 8 | batch 32 | batch-1 share of the bandwidth bound |")
    print("|---|---:|---|---:|---:|---:|---:|")
    batches = (1, 8, 32)
    for kind in ("bf16", "Q8_0", "Q4_0", "Q4_K", "Q6_K") if not quick else ("bf16", "Q4_0", "Q4_K"):
        model = load_model(folder, torch.bfloat16, torch.device("cuda"))
        if kind != "bf16":
            done: dict[int, BlockMatrix] = {}
            for owner, name, _ in matrix_slots(model):
                w = getattr(owner, name)
                if id(w) not in done:
                    done[id(w)] = BlockMatrix.from_gguf(kind, random_block_bytes(kind, *w.shape, seed=len(done)), tuple(w.shape))
                replace_matrix(owner, name, done[id(w)])
            replace_matrix(model, "embed_tokens", model.lm_head)  # tied: the embedding reads rows of the same blocks
            weight_bytes = sum(m.nbytes for m in done.values())
        else:
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        for graphs in (False, True):
            runner = ModelRunner(folder, model=model, device="cuda", max_total_tokens=60_000, max_running_requests=64,
                                 cuda_graph_max_bs=32 if graphs else 0)  # fmt: skip
            times = []
            for batch in batches:
                formcast_run(runner, contexts(min(batch, 2), 9), 2)
                times.append(formcast_run(runner, contexts(batch, seed=batch), 8 if quick else 16)[1])
            share = weight_bytes / (times[0] / 1e3) / 4.3e12
            print(f"| {kind} | {weight_bytes / 1e6:.0f} | {'on' if graphs else 'off'} | "
                  + " | ".join(f"{t:.2f}" for t in times) + f" | {share:.0%} |", flush=True)  # fmt: skip
            del runner
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()
    shutil.rmtree(folder)


def _random_llama_1b(folder: Path) -> None:
    """Section 4's random ~1B Llama-shaped model, saved in bf16 (built on the GPU: faster)."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=32,
                         num_key_value_heads=8, max_position_embeddings=4096, tie_word_embeddings=True)  # fmt: skip
    with torch.device("cuda"):
        hf = tf.LlamaForCausalLM(cfg).to(torch.bfloat16)
    hf.save_pretrained(str(folder))


def _best_step_ms(forward, batch, rounds: int, reps: int) -> float:  # type: ignore[no-untyped-def]
    """Best over ``rounds`` of the mean wall time of ``forward(batch)`` followed by a CUDA
    synchronize (each step waits for its logits, as a sampler does)."""
    forward(batch)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            forward(batch)
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / reps * 1e3)
    return best


def bench_cuda_graphs(quick: bool) -> None:
    """Decode step of the random 1B Llama-shaped bf16 model with CUDA graphs off (the eager
    forward) and on (a replayed graph), on the same batch: contexts of 200 tokens at batch 1,
    mixed 64-400 at 8 and 32. The step is the same forward run again and again (same tokens,
    same KV slots rewritten), so every repetition does the same work."""
    from engine.model_executor.forward_batch import ForwardBatch, ForwardInput
    from engine.model_executor.model_runner import ModelRunner

    folder = Path(tempfile.mkdtemp())
    _random_llama_1b(folder)
    start = time.perf_counter()
    runner = ModelRunner(folder, dtype="bfloat16", device="cuda", max_total_tokens=40_000, max_running_requests=64, cuda_graph_max_bs=32)
    graphs = runner.cuda_graph_runner
    assert graphs is not None, "the model is eligible for CUDA graphs"
    print(f"\n## CUDA graphs: decode step, random 1B Llama-shaped model, bf16 (ms per step; buckets {graphs.buckets}, "
          f"load + capture {time.perf_counter() - start:.1f} s)\n")  # fmt: skip
    print("| batch | avg ctx | graphs off ms | graphs on ms | off/on | max abs logit diff |")
    print("|---:|---:|---:|---:|---:|---:|")
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    rng = random.Random(0)
    rounds, reps = (3, 10) if quick else (5, 20)
    for batch in (1, 8, 32):
        lens = [200] if batch == 1 else [rng.randint(64, 400) for _ in range(batch)]
        slots = runner.req_to_token_pool.alloc(batch)
        held = [runner.token_to_kv_pool.alloc(n + 1) for n in lens]
        prompts = [[rng.randrange(100, 40000) for _ in range(n)] for n in lens]
        prefill = runner.forward(ForwardBatch.init_new([ForwardInput(s, 0, p, h[:-1]) for s, p, h in zip(slots, prompts, held)], *pools))
        tokens = prefill.next_token_logits.argmax(-1).tolist()
        step = ForwardBatch.init_new([ForwardInput(s, n, [t], h[-1:]) for s, n, t, h in zip(slots, lens, tokens, held)], *pools)
        logits, times = [], []
        for on in (False, True):
            graphs.enabled = on
            before = graphs.replays
            logits.append(runner.forward(step).next_token_logits)
            times.append(_best_step_ms(runner.forward, step, rounds, reps))
            assert (graphs.replays > before) == on, "graphs on: the step replays a graph; off: never"
        diff = (logits[0] - logits[1]).abs().max().item()
        print(f"| {batch} | {sum(lens) // batch} | {times[0]:.2f} | {times[1]:.2f} | {times[0] / times[1]:.1f}x | {diff:.2e} |", flush=True)
        for h in held:
            runner.token_to_kv_pool.free(h)
        runner.req_to_token_pool.free(slots)
    graphs.enabled = True
    shutil.rmtree(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-engine", action="store_true", help="kernels only")
    ap.add_argument("--only", default=None, help="comma-separated sections: bitmask, attention, runner, engine, gguf, graphs")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    only = set(args.only.split(",")) if args.only else None
    run = lambda name: (only is None and not (args.skip_engine and name not in ("bitmask", "attention"))) or (only is not None and name in only)  # noqa: E731
    if run("bitmask"):
        from kernel_bench import bench_gpu_apply

        bench_gpu_apply(0.5)
    if run("attention"):
        bench_decode_attention(args.quick)
    if run("runner"):
        check_runner_vs_transformers()
    if run("engine"):
        engine_and_decode_speed(args.tokenizer, args.quick)
    if run("gguf"):
        gguf_decode_speed(args.quick)
    if run("graphs"):
        bench_cuda_graphs(args.quick)


if __name__ == "__main__":
    main()
