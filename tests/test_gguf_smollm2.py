"""The embedded SmolLM2-135M-Instruct run straight from its Q4_1 GGUF, against llama.cpp on the same file.

Greedy continuations of 16 chat prompts, 32 tokens each (or up to ``<|im_end|>``), fed the same
token ids: issue 24 wants at least 14 of the 16 token-identical to llama.cpp's (an expected failure
today: 4 to 8 of 16); the test fails where formcast's products are broken. formcast multiplies Q4_1
weights by activations quantized to Q8_1 blocks (Q8_0 for the Q8_0 token embedding used as the
head), as llama.cpp does; dequantizing to float instead agreed on 9 of 16. What separates the two
is then float rounding outside the products (llama.cpp's float16 attention, its RoPE angles),
which those 8-bit blocks amplify: see BENCHMARKS.md, issue 24. Needs ``llama_cpp`` (CI has it).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import llama_cpp_model, require_optional
from model_loop import GreedyLoop

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three primary colors.",
    "What is 12 times 7?",
    "Give me a JSON object with a name and an age.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in five words.",
    "What does CPU stand for?",
    "Name a planet with rings.",
    "Suggest a name for a pet turtle.",
    "How many days are in a leap year?",
    "What is the boiling point of water in Celsius?",
    "Write a Python function that adds two numbers.",
    "Tell me a fun fact about octopuses.",
]
NEW_TOKENS = 32
EOS = 2  # <|im_end|>


def chat_prompt_ids(path) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """PROMPTS as chat turns, tokenized by the GGUF file's own tokenizer."""
    from engine.hf.gguf_tokenizer import load_gguf_tokenizer

    tokenizer = load_gguf_tokenizer(path)
    return [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)
        for p in PROMPTS
    ]  # fmt: skip


def llama_cpp_greedy(path, prompts: list[list[int]], tokens: int, **options: object) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """llama.cpp's greedy continuations of each prompt (``options`` go to ``llama_cpp.Llama``)."""
    llm = llama_cpp_model(path, n_ctx=512, logits_all=True, **options)
    outputs = []
    for prompt in prompts:
        llm.reset()
        llm.eval(prompt)
        out: list[int] = []
        for _ in range(tokens):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(token)
            if token == EOS:
                break
            llm.eval([token])
        outputs.append(out)
    return outputs


# llama.cpp's own variants agree with its defaults on 5 (flash attention) to 8 (the prompt fed one
# token at a time) of these 16 prompts (bench/gguf_agreement.py): greedy continuations of a 4-bit
# 135M model turn on logit gaps of thousandths. formcast itself agreed on 4 to 8 over the fourth and
# fifth sessions, the process that compiled its decode-attention kernel differing from those that
# loaded it from numba's cache (1e-7 apart); every process now loads it (BENCHMARKS.md, attn5: 6 of
# 16 in the first process on an empty cache and in the next). A broken product agrees on none (a 10%
# error in the Q4_1 minimum term: 0 of 16), hence the floor; issue 24's 14/16 stays an expected failure.
AGREEMENT_FLOOR = 2
AGREEMENT_TARGET = 14


@pytest.mark.slow
def test_smollm2_q4_1_greedy_matches_llama_cpp():
    require_optional("llama_cpp")
    from engine.hf.model_files import gguf_path
    from engine.model_executor.model_runner import ModelRunner

    path = gguf_path()
    prompts = chat_prompt_ids(path)
    runner = ModelRunner(path, max_total_tokens=4096, max_running_requests=len(prompts))
    ours = GreedyLoop(runner).greedy(prompts, NEW_TOKENS, eos={EOS})
    # One thread: llama.cpp's tokens are the same as with two (bench/gguf_agreement.py: 16/16), and
    # its two threads meet at a spinning barrier every operation, which beside another busy
    # worker took this test from 28 s to 89 s.
    theirs = llama_cpp_greedy(path, prompts, NEW_TOKENS, n_batch=512, n_threads=1)
    same = sum(a == b for a, b in zip(ours, theirs))
    report = [(i, next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)) for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert same >= AGREEMENT_FLOOR, f"{same}/16 identical; (prompt, first differing token): {report}"
    if same < AGREEMENT_TARGET:
        pytest.xfail(f"{same}/16 identical, issue 24's target is {AGREEMENT_TARGET}; (prompt, first differing token): {report}")
