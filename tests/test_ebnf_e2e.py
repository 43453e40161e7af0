"""End to end: SmolLM2-135M-Instruct generates under each test grammar and under a structural tag.

Every finished output must parse with the independent parser (Lark Earley on the .lark file,
``json`` for JSON); tool calls found in structural-tag output must validate against their schemas.
Budget-aware closing makes every row finish inside ``max_new_tokens``.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from grammar import compile_ebnf, compile_grammar
from grammar.structural_tag import StructuralTagItem, structural_tag_to_grammar
from test_ebnf_grammars import GRAMMARS, NAMES, oracle

PROMPTS = {
    "json": "Give a JSON object describing a cat.",
    "arith": "Write an arithmetic expression equal to 42.",
    "sql": "Write a SQL query listing the names of users older than 30.",
    "clike": "Write a C function that adds two integers.",
    "sexp": "Write a Lisp expression that doubles 21.",
    "csv": "Write a CSV table of three fruits and their colors.",
    "brackets": "Write a balanced sequence of brackets.",
}
MAX_NEW_TOKENS = 40




@pytest.mark.slow
def test_smollm2_outputs_parse_under_each_grammar(smollm2_model, smollm2_tokenizer, smollm2_vocab) -> None:
    from engine.hf.processor import generate_with_grammars

    grammars = [compile_ebnf((GRAMMARS / f"{n}.ebnf").read_text(), smollm2_vocab) for n in NAMES]
    outs = generate_with_grammars(
        smollm2_model, smollm2_tokenizer, [PROMPTS[n] for n in NAMES], grammars, max_new_tokens=MAX_NEW_TOKENS
    )
    bad = [(n, text) for n, text in zip(NAMES, outs) if not oracle(n, text.encode())]
    for n, text in zip(NAMES, outs):
        print(f"  {n:9s} {text!r}")
    assert not bad, bad


@pytest.mark.slow
def test_smollm2_structural_tag_calls_validate(smollm2_model, smollm2_tokenizer, smollm2_vocab) -> None:
    from engine.hf.processor import generate_with_grammars

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    tags = [StructuralTagItem("<tool_call>", schema, "</tool_call>")]
    compiled = compile_grammar(structural_tag_to_grammar(tags, ["<tool_call>"]), smollm2_vocab)
    prompt = (  # few-shot, no chat template: the small model then does make calls
        'Q: weather in Rome?\nA: <tool_call>{"city": "Rome"}</tool_call>\n'
        'Q: weather in Oslo?\nA: <tool_call>{"city": "Oslo"}</tool_call>\n'
        "Q: weather in Paris?\nA:"
    )
    outs = generate_with_grammars(smollm2_model, smollm2_tokenizer, [prompt], [compiled], max_new_tokens=40, chat=False)
    calls = 0
    for text in outs:
        print(f"  {text!r}")
        # Split the output the way the grammar does: each trigger starts a call that must be complete.
        for piece in text.split("<tool_call>")[1:]:
            body, sep, _ = piece.partition("</tool_call>")
            assert sep, text
            jsonschema.validate(json.loads(body), schema)
            calls += 1
    assert calls >= 1, outs  # the prompt reliably elicits a call; without one this test checks nothing
