"""Benchmark: ``ModelRunner.forward`` against ``transformers`` on the same weights and dtype.

    python bench/forward_bench.py [--dtypes float32,bfloat16] [--batches 1,8,32] [--steps 8]
                                  [--threads N] [--agreement 100] [--model PATH]

For each dtype and batch size, contexts are drawn (seeded) between 64 and 1,024 tokens:
* prefill tokens/s: formcast prefills every row in one forward (no padding); transformers runs
  one left-padded batch with an attention mask, as ``generate`` does;
* decode ms/step: the mean over ``--steps`` steps that each add one token to every row
  (formcast: paged KV cache; transformers: its ``DynamicCache``).
The memory-bandwidth bound of a batch-1 decode step is measured in the same run: a
matrix-vector product over a float32 matrix as large as the model's weights gives GB/s, and
bound = weight bytes (in the dtype) / GB/s. Each engine's batch-1 decode is reported as a share of
it. ``--agreement N``: greedy outputs of N prompts (32 tokens) in each half-precision dtype
against float32, as the share of prompts whose outputs are identical and of tokens before the
first difference. Not collected by pytest.

    python bench/forward_bench.py --families qwen3,gemma3,phi3,qwen3_moe,qwen3_active [--size 0.5b] ...

``--families``: instead of one model folder, random-weight models of those families built here
from transformers configs, saved once under ``--cache`` and compared the same way. ``--size``
picks the shapes (``SIZES``): ``0.5b`` or ``1.5b`` for the dense families, with the MoE families
then near 1B total / 0.3B active parameters (32 experts, top 8); ``small`` (dense ~45M, MoE ~0.12B
/ 0.05B active) for a loaded machine. ``qwen3_active`` is a dense Qwen3 of the MoE's active size
(its layers and hidden size, an MLP as wide as the top-k experts together): the MoE's batch-1 step
should cost close to it, not to a dense model of the MoE's total size. For a mixture of experts
the table adds the shares of formcast's decode time spent routing (router, top-k, shared expert:
the MoE block minus its experts) and in the chosen experts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.model_executor.forward_batch import ForwardBatch, ForwardInput  # noqa: E402
from engine.layers.panel_linear import panel_weights  # noqa: E402
from engine.model_executor.model_runner import ModelRunner  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# --size -> (dense shape, MoE shape); every family takes its size's shape plus its own fields below
SIZES = {
    "0.5b": (
        dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=4,
             head_dim=64, intermediate_size=4096, max_position_embeddings=4096, tie_word_embeddings=True),
        dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
             head_dim=64, intermediate_size=4096, max_position_embeddings=4096, tie_word_embeddings=True,
             num_experts=32, num_experts_per_tok=8, moe_intermediate_size=640, norm_topk_prob=True),
    ),
    "1.5b": (
        dict(vocab_size=32000, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
             head_dim=128, intermediate_size=8960, max_position_embeddings=4096, tie_word_embeddings=True),
        None,  # the 0.5b entry's MoE
    ),
    "small": (
        dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, intermediate_size=2048, max_position_embeddings=4096, tie_word_embeddings=True),
        dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, intermediate_size=2048, max_position_embeddings=4096, tie_word_embeddings=True,
             num_experts=16, num_experts_per_tok=4, moe_intermediate_size=512, norm_topk_prob=True),
    ),
}  # fmt: skip
# family -> (config class, model class, its own fields, MoE shape (True) or dense)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}, False),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(sliding_window=512, query_pre_attn_scalar=64), False),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(sliding_window=512, query_pre_attn_scalar=64), False),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0), False),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {}, True),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {}, True),
    "qwen3_active": ("Qwen3Config", "Qwen3ForCausalLM", {}, True),  # dense, the MoE's active size
}  # fmt: skip


def family_shape(family: str, size: str) -> dict:
    config_name, model_name, own, moe = FAMILIES[family]
    dense, moe_shape = SIZES[size]
    if not moe:
        return {**dense, **own}
    shape = dict(moe_shape or SIZES["0.5b"][1])
    if family == "olmoe":  # OLMoE's experts are intermediate_size wide
        shape["intermediate_size"] = shape["moe_intermediate_size"]
    if family == "qwen3_active":  # one dense MLP as wide as the chosen experts together
        shape["intermediate_size"] = shape["moe_intermediate_size"] * shape["num_experts_per_tok"]
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
            shape.pop(key)
    return {**shape, **own}


def family_folder(family: str, cache: Path, size: str = "0.5b") -> Path:
    """A random-weight model of ``family`` at ``size`` (``SIZES``), saved once under ``cache``."""
    import transformers as tf

    folder = cache / size / family
    if (folder / "config.json").is_file():
        return folder
    config_name, model_name, _, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = getattr(tf, model_name)(getattr(tf, config_name)(**family_shape(family, size)))
    model.save_pretrained(str(folder))
    return folder


class MoeTimer:
    """Seconds spent inside the MoE blocks' forward (``seconds``: router, top-k, shared expert and
    chosen experts) and in their chosen experts alone (``expert_seconds``), while installed."""

    def __init__(self, runner: ModelRunner) -> None:
        from engine.models.moe import SparseMoeBlock

        self.blocks = [m for m in runner.model.modules() if isinstance(m, SparseMoeBlock)]
        self.seconds = 0.0
        self.expert_seconds = 0.0

    def _timed(self, inner, into: str):  # type: ignore[no-untyped-def]
        def timed(*args):  # type: ignore[no-untyped-def]
            _sync(args[0].device)
            start = time.perf_counter()
            out = inner(*args)
            _sync(args[0].device)
            setattr(self, into, getattr(self, into) + time.perf_counter() - start)
            return out

        return timed

    def __enter__(self) -> "MoeTimer":
        for block in self.blocks:
            block.forward = self._timed(block.forward, "seconds")  # type: ignore[method-assign]
            block.experts = self._timed(block.experts, "expert_seconds")  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for block in self.blocks:
            del block.forward, block.experts


def measure_bandwidth(weight_bytes: int) -> float:
    """GB/s of a float32 matrix-vector product over ``weight_bytes`` of matrix (best of 5)."""
    cols = 1024
    w = torch.randn(weight_bytes // (4 * cols), cols)
    x = torch.randn(1, cols)
    best = float("inf")
    with torch.inference_mode():
        F.linear(x, w)
        for _ in range(5):
            start = time.perf_counter()
            F.linear(x, w)
            best = min(best, time.perf_counter() - start)
    return w.numel() * 4 / best / 1e9


def weight_bytes(runner: ModelRunner) -> int:
    """Bytes a decode step must read: every weight (the embedding only when tied to the head)."""
    seen, total = set(), 0
    for name, p in runner.model.named_parameters(remove_duplicate=False):
        if id(p) in seen or (name == "embed_tokens" and not runner.model_config.tie_word_embeddings):
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    untied_embedding = None if runner.model_config.tie_word_embeddings else runner.model.embed_tokens
    return total + sum(w.nbytes for w in panel_weights(runner.model) if w is not untied_embedding)


MAX_CTX = 1024


def contexts(batch: int, seed: int, vocab: int = 40000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, min(vocab, 40000)) for _ in range(rng.randint(64, max(64, MAX_CTX)))] for _ in range(batch)]


# ------------------------------------------------------------------ formcast


def formcast_run(runner: ModelRunner, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """(prefill tokens/s, mean decode ms/step); frees everything afterwards."""
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slots = runner.req_to_token_pool.alloc(len(prompts))
    held = []
    inputs = []
    for slot, p in zip(slots, prompts):
        locs = runner.token_to_kv_pool.alloc(len(p))
        held.append(locs)
        inputs.append(ForwardInput(slot, 0, p, locs))
    start = time.perf_counter()
    out = runner.forward(ForwardBatch.init_new(inputs, *pools))
    prefill = sum(map(len, prompts)) / (time.perf_counter() - start)
    lens = [len(p) for p in prompts]
    times = []
    for _ in range(steps):
        nxt = out.next_token_logits.argmax(-1).tolist()
        inputs = []
        for i, slot in enumerate(slots):
            locs = runner.token_to_kv_pool.alloc(1)
            held.append(locs)
            inputs.append(ForwardInput(slot, lens[i], [nxt[i]], locs))
            lens[i] += 1
        _sync(runner.device)
        start = time.perf_counter()
        out = runner.forward(ForwardBatch.init_new(inputs, *pools))
        out.next_token_logits.argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    for locs in held:
        runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slots)
    return prefill, statistics.mean(times[1:] if len(times) > 2 else times) * 1e3


# ------------------------------------------------------------------ transformers


def hf_run(model, prompts: list[list[int]], steps: int, pad_id: int) -> tuple[float, float]:
    import inspect

    from transformers import DynamicCache

    # transformers 5.2x names the cache argument ``cache``; earlier releases ``past_key_values``.
    cache_arg = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"

    longest = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        start = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: cache})
        prefill = sum(map(len, prompts)) / (time.perf_counter() - start)
        times = []
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            pos = pos[:, -1:] + 1
            _sync(device)
            start = time.perf_counter()
            out = model(input_ids=nxt, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_arg: cache})
            out.logits[:, -1].argmax(-1)
            _sync(device)
            times.append(time.perf_counter() - start)
    return prefill, statistics.mean(times[1:] if len(times) > 2 else times) * 1e3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ greedy agreement


def greedy_outputs(runner: ModelRunner, prompts: list[list[int]], new_tokens: int, batch: int = 16) -> list[list[int]]:
    outs = []
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
        slots = runner.req_to_token_pool.alloc(len(group))
        seqs = [list(p) for p in group]
        held, cached = [], [0] * len(group)
        for _ in range(new_tokens):
            inputs = []
            for r, slot in enumerate(slots):
                new = seqs[r][cached[r] :]
                locs = runner.token_to_kv_pool.alloc(len(new))
                held.append(locs)
                inputs.append(ForwardInput(slot, cached[r], new, locs))
                cached[r] = len(seqs[r])
            logits = runner.forward(ForwardBatch.init_new(inputs, *pools)).next_token_logits
            for r, tok in enumerate(logits.argmax(-1).tolist()):
                seqs[r].append(tok)
        for locs in held:
            runner.token_to_kv_pool.free(locs)
        runner.req_to_token_pool.free(slots)
        outs += [s[len(p) :] for s, p in zip(seqs, group)]
    return outs


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    subjects = ["a city", "a river", "an animal", "a tool", "a planet", "a food", "a sport", "a color", "a job", "a song"]
    asks = ["Describe", "Name three facts about", "Write a haiku about", "Give a JSON object describing", "Explain", "List two uses of", "Invent", "Compare two kinds of", "Summarize the history of", "Tell a joke about"]  # fmt: skip
    out = []
    for i in range(n):
        text = f"{asks[i % 10]} {subjects[(i // 10) % 10]}."
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True)
        out.append(list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids))
    return out


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--agreement", type=int, default=100, help="prompts for the greedy-agreement check (0: skip)")
    ap.add_argument("--model", default=None, help="a Hugging Face folder (default: the embedded SmolLM2)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--families", default=None, help=f"random models of these families: {','.join(FAMILIES)}")
    ap.add_argument("--size", default="0.5b", choices=sorted(SIZES), help="--families shapes (SIZES)")
    ap.add_argument("--max-ctx", type=int, default=1024, help="contexts are drawn between 64 and this many tokens")
    # beside gguf_bench's files, where a user finds and removes them (the 0.5b and 1.5b sizes take
    # about 26 GB; under /tmp they once filled the disk that a CI run installed into)
    default_cache = str(Path.home() / ".cache" / "formcast" / "bench" / "families")
    ap.add_argument("--cache", default=default_cache, help="where --families models are saved (default: %(default)s)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global MAX_CTX
    MAX_CTX = args.max_ctx
    if args.families:
        families_main(args)
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    batches = [int(b) for b in args.batches.split(",")]
    dtypes = args.dtypes.split(",")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps {args.steps}")
    rows, b1 = [], {}
    runners = {}
    for dtype in dtypes:
        runner = ModelRunner(args.model, dtype=dtype, max_total_tokens=40_000, max_running_requests=max(batches + [16]))
        runners[dtype] = runner
        hf = None if args.skip_hf else AutoModelForCausalLM.from_pretrained(str(runner.model_path), dtype=DTYPES[dtype]).eval()
        wbytes = weight_bytes(runner)
        bandwidth = measure_bandwidth(weight_bytes(runners[dtypes[0]]) if dtype != "float32" else wbytes)
        bound_ms = wbytes / (bandwidth * 1e9) * 1e3
        warm = contexts(2, seed=99)  # first calls pay one-time costs (allocator, kernels loaded from cache)
        formcast_run(runner, warm, 2)
        if hf is not None:
            hf_run(hf, warm, 2, pad_id=0)
        print(f"\n{dtype}: weights {wbytes / 1e6:.0f} MB, GEMV bandwidth {bandwidth:.1f} GB/s, batch-1 bound {bound_ms:.1f} ms/step")
        for batch in batches:
            prompts = contexts(batch, seed=batch)
            ours = formcast_run(runner, prompts, args.steps)
            theirs = hf_run(hf, prompts, args.steps, pad_id=0) if hf is not None else (float("nan"), float("nan"))
            rows.append((dtype, batch, sum(map(len, prompts)) // batch, ours, theirs, bound_ms))
            print(f"  batch {batch}: formcast prefill {ours[0]:,.0f} tok/s, decode {ours[1]:.1f} ms/step; "
                  f"transformers prefill {theirs[0]:,.0f} tok/s, decode {theirs[1]:.1f} ms/step", flush=True)
            if batch == 1:
                b1[dtype] = (ours[1], theirs[1], bound_ms)
        del hf
    print("\n| dtype | batch | avg ctx | formcast prefill tok/s | transformers prefill tok/s | formcast decode ms/step | "
          "transformers decode ms/step | formcast/transformers decode time | formcast share of bound | transformers share of bound |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dtype, batch, ctx, (fp, fd), (hp, hd), bound in rows:
        share = lambda t: f"{bound / t:.0%}" if batch == 1 else ""  # noqa: E731
        print(f"| {dtype} | {batch} | {ctx} | {fp:,.0f} | {hp:,.0f} | {fd:.1f} | {hd:.1f} | {fd / hd:.2f}x | {share(fd)} | {share(hd)} |")
    if "float32" in b1:
        for dtype, (fd, hd, _) in b1.items():
            if dtype != "float32":
                print(f"\nbatch-1 decode speed-up of {dtype} over float32: formcast {b1['float32'][0] / fd:.2f}x, "
                      f"transformers {b1['float32'][1] / hd:.2f}x")
    if args.agreement and "float32" in runners and len(runners) > 1:
        tok = AutoTokenizer.from_pretrained(str(runners["float32"].model_path))
        prompts = chat_prompts(tok, args.agreement)
        ref = greedy_outputs(runners["float32"], prompts, 32)
        for dtype, runner in runners.items():
            if dtype == "float32":
                continue
            got = greedy_outputs(runner, prompts, 32)
            same = sum(a == b for a, b in zip(ref, got))
            prefix = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ref, got))
            print(f"greedy agreement {dtype} vs float32 on {len(prompts)} prompts x 32 tokens: identical outputs "
                  f"{same}/{len(prompts)}, tokens before the first difference {prefix / (32 * len(prompts)):.0%}")


def families_main(args: argparse.Namespace) -> None:
    """Decode tokens/s of random models of several families, formcast against transformers."""
    from transformers import AutoModelForCausalLM

    batches = [int(b) for b in args.batches.split(",")]
    dtype = args.dtypes.split(",")[0]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps {args.steps}, dtype {dtype}, "
          f"size {args.size}, contexts 64..{MAX_CTX} tokens")  # fmt: skip
    rows = []
    for family in args.families.split(","):
        folder = family_folder(family, Path(args.cache), args.size)
        runner = ModelRunner(folder, dtype=dtype, max_total_tokens=MAX_CTX * max(batches) + 4096, max_running_requests=max(batches + [2]))
        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=DTYPES[dtype]).eval()
        params = sum(p.numel() for p in hf.parameters())
        active = params - _inactive_expert_params(runner)
        warm = contexts(2, seed=99, vocab=runner.vocab_size)
        formcast_run(runner, warm, 2)
        hf_run(hf, warm, 2, pad_id=0)
        for batch in batches:
            prompts = contexts(batch, seed=batch, vocab=runner.vocab_size)
            with MoeTimer(runner) as timer:
                ours = formcast_decode_only(runner, prompts, args.steps, timer)
                decode_s = ours * args.steps / 1e3
            theirs = hf_run(hf, prompts, args.steps, pad_id=0)
            shares = ("", "")
            if timer.blocks:
                shares = (f"{(timer.seconds - timer.expert_seconds) / decode_s:.0%}", f"{timer.expert_seconds / decode_s:.0%}")
            rows.append((family, params, active, batch, ours, theirs[1], *shares))
            print(f"  {family} batch {batch}: formcast {ours:.1f} ms/step, transformers {theirs[1]:.1f} ms/step", flush=True)
        del hf, runner
    print("\n| family | params (active) | batch | formcast decode tok/s | transformers decode tok/s | formcast / transformers | "
          "formcast decode time routing | formcast decode time in experts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for family, params, active, batch, fd, hd, routing, experts in rows:
        size = f"{params / 1e9:.2f}B" + (f" ({active / 1e9:.2f}B)" if active != params else "")
        print(f"| {family} | {size} | {batch} | {batch * 1e3 / fd:.1f} | {batch * 1e3 / hd:.1f} | {hd / fd:.2f}x | {routing} | {experts} |")


def formcast_decode_only(runner: ModelRunner, prompts: list[list[int]], steps: int, timer: MoeTimer | None = None) -> float:
    """Mean decode ms/step over ``steps`` steps after an (untimed) prefill, every step timed;
    ``timer`` is zeroed after the prefill, so it counts decode steps only."""
    pools = (runner.req_to_token_pool, runner.token_to_kv_pool)
    slots = runner.req_to_token_pool.alloc(len(prompts))
    held = [runner.token_to_kv_pool.alloc(len(p)) for p in prompts]
    out = runner.forward(ForwardBatch.init_new([ForwardInput(s, 0, p, loc) for s, p, loc in zip(slots, prompts, held)], *pools))
    lens, total = [len(p) for p in prompts], 0.0
    if timer is not None:
        timer.seconds = timer.expert_seconds = 0.0
    for _ in range(steps):
        nxt = out.next_token_logits.argmax(-1).tolist()
        inputs = []
        for i, slot in enumerate(slots):
            held.append(runner.token_to_kv_pool.alloc(1))
            inputs.append(ForwardInput(slot, lens[i], [nxt[i]], held[-1]))
            lens[i] += 1
        _sync(runner.device)
        start = time.perf_counter()
        out = runner.forward(ForwardBatch.init_new(inputs, *pools))
        out.next_token_logits.argmax(-1).tolist()
        total += time.perf_counter() - start
    for locs in held:
        runner.token_to_kv_pool.free(locs)
    runner.req_to_token_pool.free(slots)
    return total / steps * 1e3


def _inactive_expert_params(runner: ModelRunner) -> int:
    """Expert parameters a token does not use: (E - top_k) / E of every MoE block's experts."""
    from engine.models.moe import SparseMoeBlock

    unused = 0
    for block in runner.model.modules():
        if isinstance(block, SparseMoeBlock):
            experts = block.gate_up_proj.numel() + block.down_proj.numel()
            unused += experts * (block.num_experts - block.top_k) // block.num_experts
    return unused


if __name__ == "__main__":
    main()
