"""The Engine on a non-Llama family: a tiny random Qwen3-MoE with the SmolLM2 tokenizer (its
vocabulary size, so grammar masks apply), transformers' model as the routing oracle.

The engine invariants (batching invariance with the prefix cache, finish reasons, a regex
constraint, greedy speculation with a self-speculative draft) and the routed-experts output:
per generated token and MoE layer the chosen experts equal the top-k of transformers' router at
the position that produced the token, alone and in a batch, after retraction, and under
speculation (only accepted tokens' routes are reported).
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine
from engine.entrypoints.engine import PromptError

from test_model_families import save_tiny

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}
KW = dict(dtype="float32", max_running_requests=8, num_threads=1)
ROUTED = {**GREEDY, "return_routed_experts": True}


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory, smollm2_tokenizer):
    folder = tmp_path_factory.mktemp("qwen3_moe_engine")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    hf = save_tiny("qwen3_moe", folder, vocab_size=len(smollm2_tokenizer), eos_token_id=2, max_position_embeddings=1024)
    smollm2_tokenizer.save_pretrained(str(folder))
    yield folder, hf
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine(tiny_moe):
    with Engine(str(tiny_moe[0]), max_total_tokens=4000, **KW) as eng:
        yield eng


def _prompts(engine: Engine, n: int) -> list[list[int]]:
    topics = ["the sea", "a robot", "prime numbers", "Paris", "coffee", "the moon", "a violin", "winter"]
    return [engine.tokenizer(f"{'Please ' * (i % 4)}write about {topics[i % 8]}.")["input_ids"] for i in range(n)]


def _oracle_routes(hf, prompt: list[int], output: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Router top-k [len(output), moe_layers, k] at the positions that produced ``output``, and
    where they are decided beyond float noise."""
    seq = prompt + output[:-1]
    k = hf.config.num_experts_per_tok
    with torch.no_grad():
        logits = hf(torch.tensor([seq]), output_router_logits=True).router_logits
    probs = torch.stack([torch.softmax(r.float().reshape(len(seq), -1), -1) for r in logits], dim=1)[len(prompt) - 1 :]
    top = torch.topk(probs, k + 1, dim=-1)
    return top.indices[..., :k], (top.values[..., k - 1] - top.values[..., k]) > 1e-4


def _check_routes(hf, prompt: list[int], result: dict) -> None:
    routes = torch.tensor(result["meta_info"]["routed_experts"])
    assert routes.shape[0] == len(result["output_ids"])
    expect, decided = _oracle_routes(hf, prompt, result["output_ids"])
    same = (torch.sort(routes, -1).values == torch.sort(expect, -1).values).all(-1)
    assert bool(same[decided].all()), "routed experts differ from the router's top-k"
    assert decided.float().mean() > 0.9


def test_routes_match_the_oracle_alone_and_batched(engine, tiny_moe):
    hf = tiny_moe[1]
    prompts = _prompts(engine, 6)
    params = [{**ROUTED, "max_new_tokens": 5 + 3 * (i % 3), **({"regex": r"(yes|no)[a-z ]{2,12}\."} if i % 2 else {})} for i in range(6)]
    together = engine.generate(input_ids=prompts, sampling_params=params)
    for i in (0, 1, 4):
        alone = engine.generate(input_ids=prompts[i], sampling_params=params[i])
        assert alone["output_ids"] == together[i]["output_ids"] and alone["text"] == together[i]["text"]
        assert alone["meta_info"]["routed_experts"] == together[i]["meta_info"]["routed_experts"]
    for prompt, result in zip(prompts, together):
        _check_routes(hf, prompt, result)
    weighted = engine.generate(input_ids=prompts[0], sampling_params={**ROUTED, "max_new_tokens": 4, "return_routed_expert_weights": True})
    weights = torch.tensor(weighted["meta_info"]["routed_expert_weights"])
    assert weights.shape == torch.tensor(weighted["meta_info"]["routed_experts"]).shape
    assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:2]), atol=1e-5)  # norm_topk_prob
    plain = engine.generate(input_ids=prompts[0], sampling_params={**GREEDY, "max_new_tokens": 4})
    assert "routed_experts" not in plain["meta_info"]


def test_finish_reasons_and_constraint(engine):
    prompt = _prompts(engine, 1)[0]
    length = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 3})
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    first = length["output_ids"][0]
    stop = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 9, "stop_token_ids": [first]})
    assert stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": first} and stop["output_ids"] == [first]
    regex = engine.generate(input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 40, "regex": r"[0-9]{3}-(ab|cd)"})
    import re

    assert re.fullmatch(r"[0-9]{3}-(ab|cd)", regex["text"]) and regex["meta_info"]["finish_reason"]["type"] == "stop"


def test_retraction_keeps_outputs_and_routes(engine, tiny_moe):
    prompts = _prompts(engine, 6)
    params = {**ROUTED, "max_new_tokens": 40, "ignore_eos": True}
    reference = engine.generate(input_ids=prompts, sampling_params=params)
    with Engine(str(tiny_moe[0]), max_total_tokens=200, **KW) as small:
        got = small.generate(input_ids=prompts, sampling_params=params)
        assert small.scheduler.stats["retractions"] > 0
    for ref, g in zip(reference, got):
        assert g["output_ids"] == ref["output_ids"]
        assert g["meta_info"]["routed_experts"] == ref["meta_info"]["routed_experts"]


def test_greedy_speculation_keeps_outputs_and_accepted_routes(engine, tiny_moe):
    prompts = _prompts(engine, 4)
    params = [{**ROUTED, "max_new_tokens": 12, "ignore_eos": True, **({"regex": r"[a-z]{3,9}\.[a-z ]{2,9}"} if i == 1 else {})} for i in range(4)]
    reference = engine.generate(input_ids=prompts, sampling_params=params)
    with Engine(str(tiny_moe[0]), max_total_tokens=4000, speculative_algorithm="draft_model", speculative_draft_num_layers=2, **KW) as spec:
        got = spec.generate(input_ids=prompts, sampling_params=params)
        stats = spec.scheduler.spec.stats
    assert stats["drafted"] > 0 and 0 < stats["accepted"] < stats["drafted"], stats  # some drafts rejected
    for prompt, ref, g in zip(prompts, reference, got):
        assert g["output_ids"] == ref["output_ids"]
        assert g["meta_info"]["routed_experts"] == ref["meta_info"]["routed_experts"]


def test_dense_model_refuses_routed_experts(tmp_path, smollm2_tokenizer):
    save_tiny("qwen3", tmp_path, num_hidden_layers=1, vocab_size=len(smollm2_tokenizer), max_position_embeddings=256)
    smollm2_tokenizer.save_pretrained(str(tmp_path))
    with Engine(str(tmp_path), max_total_tokens=300, **KW) as dense:
        with pytest.raises(PromptError, match="return_routed_experts"):
            dense.generate("hello", {**ROUTED, "max_new_tokens": 2})


def test_routed_experts_in_openai_responses(engine, tiny_moe):
    """Over HTTP the ids come back per choice (``routed_experts`` [token][moe layer][k], and
    ``routed_expert_weights`` on request), whole and streamed (each chunk: its tokens'), equal to
    the Engine's own output for the same prompt ids, which the tests above check against the oracle."""
    from server_harness import ServerThread

    prompt = _prompts(engine, 1)[0]
    ask = {"return_routed_experts": True, "return_routed_expert_weights": True}
    ref = engine.generate(input_ids=prompt, sampling_params={**ROUTED, "max_new_tokens": 5, "return_routed_expert_weights": True})
    server = ServerThread(engine)
    try:
        client = server.client()
        model = client.models.list().data[0].id
        whole = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, extra_body=ask)
        choice = whole.choices[0].model_dump()
        assert choice["routed_experts"] == ref["meta_info"]["routed_experts"]
        torch.testing.assert_close(torch.tensor(choice["routed_expert_weights"]), torch.tensor(ref["meta_info"]["routed_expert_weights"]))
        assert len(choice["routed_experts"]) == whole.usage.completion_tokens
        streamed = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, extra_body=ask, stream=True)
        routes = [r for c in streamed for ch in c.choices for r in (ch.model_dump().get("routed_experts") or [])]
        assert routes == ref["meta_info"]["routed_experts"]
        plain = client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0).choices[0].model_dump()
        assert "routed_experts" not in plain and "routed_expert_weights" not in plain

        messages = [{"role": "user", "content": "Say something."}]
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                              extra_body={"return_routed_experts": True})  # fmt: skip
        chat_routes = chat.choices[0].model_dump()["routed_experts"]
        assert len(chat_routes) == chat.usage.completion_tokens
        assert "routed_expert_weights" not in chat.choices[0].model_dump()
        cfg = engine.runner.model_config
        assert all(len(step) == sum(cfg.moe.sparse_layers) and all(len(k) == cfg.moe.top_k for k in step) for step in chat_routes)
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                                extra_body={"return_routed_experts": True}, stream=True)  # fmt: skip
        assert [r for c in stream for ch in c.choices for r in (ch.model_dump().get("routed_experts") or [])] == chat_routes
    finally:
        server.stop()
