"""Structural tags (free text + schema-checked calls) and the choice constraint."""

from __future__ import annotations

import functools
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammar import GrammarMatcher, TokenVocabulary, compile_grammar
from grammar.errors import GrammarError
from grammar.structural_tag import StructuralTagItem, choice_to_grammar, structural_tag_to_grammar

VOCAB = TokenVocabulary.byte_level()
EOS = VOCAB.vocab_size - 1
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city"],
}
TAGS = [
    StructuralTagItem("<tool_call>", WEATHER, "</tool_call>"),
    StructuralTagItem("<function=get_time>", {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}}, "</function>"),
]
TRIGGERS = ["<tool_call>", "<function="]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@functools.lru_cache(maxsize=None)
def compiled():
    return compile_grammar(structural_tag_to_grammar(TAGS, TRIGGERS), VOCAB)


def accepts(text: str) -> bool:
    m = GrammarMatcher(compiled())
    for b in text.encode():
        allowed = bool(m.get_next_token_bitmask()[b // 32] >> (b % 32) & 1)
        assert m.accept_token(b) == allowed
        if not allowed:
            return False
    return m.accept_token(EOS)


free_text = st.text(alphabet=st.sampled_from(list("<tool_cafuni=>/ xé\n")), max_size=40)


@SETTINGS
@given(free_text)
def test_free_text_is_accepted_iff_it_contains_no_trigger(text: str) -> None:
    assert accepts(text) == (not any(t in text for t in TRIGGERS)), text


bodies = st.sampled_from([
    {"city": "Paris"}, {"city": "Oslo", "days": 3}, {"city": "x", "days": 0}, {"days": 2}, {"city": 5},
])
time_bodies = st.sampled_from([{}, {"tz": "UTC"}, {"tz": "PST"}])


@SETTINGS
@given(st.lists(st.tuples(free_text, st.booleans(), bodies, time_bodies), max_size=3), free_text)
def test_calls_are_accepted_iff_their_bodies_validate(calls, tail: str) -> None:
    parts, valid = [], True
    for text, weather, body, tbody in calls:
        if any(t in text for t in TRIGGERS) or any(t in text + "<" for t in TRIGGERS[1:]):
            return  # the trigger would fire inside the free text
        if weather:
            parts += [text, "<tool_call>", json.dumps(body), "</tool_call>"]
            valid &= jsonschema.Draft202012Validator(WEATHER).is_valid(body)
        else:
            parts += [text, "<function=get_time>", json.dumps(tbody), "</function>"]
            valid &= tbody.get("tz", "UTC") in ("UTC", "CET")
    if any(t in tail for t in TRIGGERS):
        return
    doc = "".join(parts) + tail
    assert accepts(doc) == valid, doc


def test_examples() -> None:
    assert accepts('Let me check. <tool_call>{"city": "Rome"}</tool_call> Done.')
    assert accepts('<<tool_call>{"city": "Rome"}</tool_call><function=get_time>{"tz": "CET"}</function>')
    assert accepts("a <tool_cal <function")  # unfinished trigger prefixes are free text
    assert not accepts('<function=get_date>{}</function>')  # no tag begins like that
    assert not accepts('<tool_call>{"city": "Rome"}')  # unfinished call cannot end
    assert not accepts('<tool_call>{"city": "Rome"}</tool_call')


def test_long_free_text_keeps_the_stack_flat() -> None:
    assert accepts("<tool " * 2000 + '<tool_call>{"city": "a"}</tool_call>' + "x<" * 2000)


@pytest.mark.parametrize(
    "tags, triggers, message",
    [
        (TAGS, [], "at least one trigger"),
        (TAGS, ["<tool_call>", "<tool"], "occurs inside"),
        (TAGS, ["<tool_call>"], "starts with no trigger"),
        (TAGS[:1], TRIGGERS, "has no tag"),
        (TAGS, ["", "<function="], "non-empty"),
    ],
)
def test_invalid_configurations(tags, triggers, message) -> None:
    with pytest.raises(GrammarError, match=message):
        structural_tag_to_grammar(tags, triggers)


def test_dict_tags_are_accepted() -> None:
    g = structural_tag_to_grammar([{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}], ["<a>"])
    m = GrammarMatcher(compile_grammar(g, VOCAB))
    assert m.accept_bytes("x<a>12</a>y") and m.can_terminate()
    assert not GrammarMatcher(compile_grammar(g, VOCAB)).accept_bytes("<a>1.5")


def test_real_vocabulary_token_by_token(smollm2_vocab, smollm2_tokenizer) -> None:
    m = GrammarMatcher(compile_grammar(structural_tag_to_grammar(TAGS, TRIGGERS), smollm2_vocab))
    doc = 'Sure! <tool_call>{"city": "Rome", "days": 2}</tool_call> and <function=get_time>{"tz": "UTC"}</function>.'
    for tok in smollm2_tokenizer.encode(doc, add_special_tokens=False):
        assert m.get_next_token_bitmask()[tok // 32] >> (tok % 32) & 1
        assert m.accept_token(tok)
    assert m.can_terminate()


def test_choice() -> None:
    c = compile_grammar(choice_to_grammar(["yes", "no", "not sure"]), VOCAB)
    for text, ok in [("yes", True), ("no", True), ("not sure", True), ("not", False), ("nope", False)]:
        m = GrammarMatcher(c)
        assert (m.accept_bytes(text) and m.can_terminate()) == ok, text
    with pytest.raises(GrammarError):
        choice_to_grammar([])
