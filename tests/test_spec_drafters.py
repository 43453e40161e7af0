"""The n-gram drafter's choice of match, how it ends a copied JSON value, and the cost model's
draft length (issue 29), without a model: a request stand-in carries the sequence, and token
texts are a small table (a real grammar over a small vocabulary where a value is closed)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.speculative.drafters import DraftState, NgramDrafter
from engine.speculative.worker import SpeculativeConfig, SpeculativeWorker

# Token ids -> text: letters and digits are informative, punctuation and JSON structure are not.
TEXT = {1: b"Mar", 2: b"ia", 3: b" Lopez", 4: b" lives", 5: b'","', 6: b"city", 7: b'":"', 8: b"Mad",
        9: b"rid", 10: b"Bar", 11: b"ce", 12: b"lona", 13: b"{", 14: b"name", 15: b"}", 16: b" in"}  # fmt: skip


class Texts:
    def token_bytes(self, ids: list[int]) -> bytes:
        return b"".join(TEXT[i] for i in ids)


def _state(prompt: list[int], output: list[int], forced_tail: int = 0, budget: int = 3) -> DraftState:
    req = SimpleNamespace(
        rid="r", origin_input_ids=prompt, output_ids=output, fill_ids=prompt + output, forced_tail=forced_tail,
        remaining_tokens=100, context_len=1000, seq_len=len(prompt) + len(output), grammar=None, grammar_applies=False,
    )  # fmt: skip
    return DraftState(req, budget, False, None, Texts())  # type: ignore[arg-type]


def New(**kw) -> NgramDrafter:  # type: ignore[no-untyped-def]  # noqa: N802
    """The drafter with issue 29's match rules on."""
    return NgramDrafter(**{"max_n": 8, "prefer_prompt": True, "skip_structural": True, **kw})


def _draft(drafter: NgramDrafter, state: DraftState) -> list[int]:
    drafter.extend(state)
    return state.tokens


def test_at_equal_length_the_prompt_wins_over_the_output():
    # "Mar ia" continues with " Lopez" in the prompt and with " lives" earlier in the output.
    prompt, output = [1, 2, 3, 16, 8, 9], [1, 2, 4, 1, 2]
    assert _draft(New(), _state(prompt, output)) == [3, 16, 8]
    assert _draft(New(prefer_prompt=False), _state(prompt, output)) == [4, 1, 2]


def test_the_longest_match_wins_wherever_it_is():
    # "Mar ia" is in the prompt (-> " Lopez"), but the output has "{ Mar ia" (-> " lives").
    prompt, output = [1, 2, 3, 16, 8, 9], [13, 1, 2, 4, 15, 13, 1, 2]
    assert _draft(New(), _state(prompt, output)) == [4, 15, 13]


def test_a_structural_suffix_proposes_nothing():
    # The output ends with '","' (sampled) then 'city' '":"' (forced): the only earlier match
    # is the previous key's value in the output, which is structure, not evidence.
    prompt = [1, 2, 3, 16, 8, 9, 4, 16]
    output = [13, 14, 7, 1, 2, 3, 5, 6, 7, 10, 11, 12, 5, 6, 7]
    assert _draft(New(), _state(prompt, output, forced_tail=2)) == []
    assert _draft(New(skip_structural=False), _state(prompt, output, forced_tail=2)) == [10, 11, 12]
    # Once a letter was sampled, the value is found in the document.
    assert _draft(New(), _state(prompt, output + [8], forced_tail=0)) == [9, 4, 16]


def test_forced_drafted_tokens_count_as_structure():
    state = _state([1, 2, 3], [5], forced_tail=1)
    state.tokens, state.forced = [6, 7], [True, True]
    assert state.forced_tail() == 3
    state.forced = [False, True]
    assert state.forced_tail() == 1


def _worker(cost: float, top: int = 6) -> SpeculativeWorker:
    return SpeculativeWorker(None, None, SpeculativeConfig(algorithm="ngram", num_draft_tokens=top, verify_cost=cost))  # type: ignore[arg-type]


def test_the_cost_model_drafts_long_when_drafts_are_accepted_and_cheap():
    req = SimpleNamespace(spec_record=(0.0, 0.0), spec_k=None)
    worker = _worker(0.05)
    assert 0 < worker._cost_k(req) < 6  # the prior: acceptance 1/2
    for _ in range(5):
        worker._adapt(req, 4, 4, 0)
    assert worker._cost_k(req) == 6
    assert _worker(2.0)._cost_k(req) == 0  # a verified row costs twice a decode: never pays


def test_the_cost_model_stops_drafting_on_rejections_and_tries_again_later():
    req = SimpleNamespace(spec_record=(0.0, 0.0), spec_k=None)
    worker = _worker(0.3)
    for _ in range(4):
        worker._adapt(req, 3, 0, 0)
    assert worker._cost_k(req) == 0
    ks = [worker._cost_k(req) for _ in range(20)]  # no drafts: the record fades to the prior
    assert ks[0] == 0 and ks[-1] > 0


def test_verify_cost_option_is_checked():
    import pytest

    from engine.entrypoints.engine_args import EngineArgs

    assert EngineArgs.from_options(speculative_verify_cost=0.15).speculative_verify_cost == 0.15
    for bad in (-0.1, float("inf"), "0.1", True):
        with pytest.raises(ValueError, match="speculative_verify_cost"):
            EngineArgs.from_options(speculative_verify_cost=bad)


# A real grammar for the value-closing rule: a small vocabulary, an object of two strings.
CLOSE_VOCAB = [b"", b'{"', b"name", b'":"', b"Mar", b"ia", b" Lopez", b",", b" Madrid", b".", b'"', b'","', b"city",
               b'"}', b"es", b"@", b"acme", b" works", b"price", b'":', b"24", b".5", b" EUR", b',"', b"}]", b"},",
               b"[", b"}", b"]", b"7",
               b"2", b"0", b"1", b"9", b"-"]  # fmt: skip
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
          "required": ["name", "city"], "additionalProperties": False}  # fmt: skip


def _compiled(schema: dict):  # type: ignore[no-untyped-def]
    from grammar import TokenVocabulary, compile_json_schema

    return compile_json_schema(schema, TokenVocabulary.from_token_bytes(CLOSE_VOCAB, [0]), whitespace="compact")


def _grammar_state(prompt: list[int], output: list[int], budget: int = 4, schema: dict = PERSON, compiled=None,  # type: ignore[no-untyped-def]
                   greedy: bool = True) -> DraftState:  # fmt: skip
    from engine.managers.detokenizer import TokenTexts
    from grammar import GrammarMatcher

    compiled = compiled if compiled is not None else _compiled(schema)
    vocab = compiled.vocab
    matcher = GrammarMatcher(compiled)
    for t in output:
        assert matcher.accept_token(t), t
    req = SimpleNamespace(
        rid="r", origin_input_ids=prompt, output_ids=output, fill_ids=prompt + output, forced_tail=0, remaining_tokens=100,
        context_len=1000, seq_len=len(prompt) + len(output), grammar=matcher, grammar_applies=True,
        sampling_params=SimpleNamespace(is_greedy=greedy),
    )  # fmt: skip
    return DraftState(req, budget, False, None, TokenTexts(vocab))  # type: ignore[arg-type]


def test_a_copied_value_is_closed_where_the_document_reaches_punctuation():
    # The document: "Maria Lopez, Madrid." The output copies the name into "name"; the copy's
    # continuation starts with "," which, in a document, ends the value: the drafter proposes
    # the closing quote as the longest token spelling it and the forced text after it ('","').
    prompt, output = [4, 5, 6, 7, 8, 9, 17], [1, 2, 3, 4, 5]
    assert _draft(New(), _grammar_state(prompt, output)) == [6, 11]
    assert _draft(New(close_values=False), _grammar_state(prompt, output)) == [6, 7, 8, 9]  # off: the copy runs on
    # Inside the city's value, "." then nothing ends the document's sentence: closed with '"}'.
    city = [1, 2, 3, 4, 5, 6, 11, 12, 3]
    assert _draft(New(), _grammar_state(prompt, city + [8])) == [13]


def test_a_full_stop_inside_a_word_is_not_a_boundary():
    # "acme.es works Lopez": the "." is followed by letters, so the copy goes on through it.
    prompt, output = [16, 9, 14, 17, 6], [1, 2, 3, 16]
    assert _draft(New(), _grammar_state(prompt, output)) == [9, 14, 17, 6]


def test_a_string_is_closed_with_the_longest_token_spelling_its_end():
    # At the end of the city's value the object ends too: '"}' rather than '"' then '}'.
    prompt = [4, 5, 6, 7, 8, 9, 17]
    output = [1, 2, 3, 4, 5, 6, 10, 7, 10, 12, 3, 8]
    assert _draft(New(), _grammar_state(prompt, output)) == [13]


def test_a_copied_number_ends_where_the_grammar_refuses_the_copy():
    # "24.5 EUR": the copy of the price stops at " EUR" (not a number); the drafter ends the
    # number with the longest token spelling the comma and the next key's forced text (',"').
    schema = {"type": "object", "properties": {"price": {"type": "number"}, "name": {"type": "string"}},
              "required": ["price", "name"], "additionalProperties": False}  # fmt: skip
    prompt, output = [20, 21, 22, 17, 6], [1, 18, 19, 20]
    assert _draft(New(), _grammar_state(prompt, output, schema=schema)) == [21, 23]
    assert _draft(New(close_values=False), _grammar_state(prompt, output, schema=schema)) == [21]


def test_between_equally_long_endings_the_one_the_request_wrote_wins():
    # A price ends an item of an array: '},' (another item) and '}]' (the end) are both two
    # bytes. With nothing written yet the lower id wins ('}]'); once the request has written
    # '},' it is drafted again.
    schema = {"type": "array", "items": {"type": "object", "properties": {"price": {"type": "number"}},
                                         "required": ["price"], "additionalProperties": False}}  # fmt: skip
    prompt = [29, 21, 22, 17, 6]  # "7.5 EUR works Lopez"
    first = [26, 1, 18, 19, 29]  # '[{"price":7'
    assert _draft(New(), _grammar_state(prompt, first, schema=schema)) == [21, 24]
    second = [26, 1, 18, 19, 20, 25, 1, 18, 19, 29]  # '[{"price":24},{"price":7'
    assert _draft(New(), _grammar_state(prompt, second, schema=schema)) == [21, 25]


DATE = [30, 31, 32, 33, 34, 31, 32, 34, 31, 33]  # "2019-01-09"
WORDS = [4, 5, 6, 16, 8, 9, 6, 17] * 6


def test_where_no_ngram_fits_a_date_is_looked_up_in_the_prompt_by_the_grammar():
    # Right after '"name":"' nothing of the prompt follows the same tokens; the grammar (a date)
    # takes the prompt's date, drafted up to the budget. Without the lookup: no draft.
    schema = {"type": "object", "properties": {"name": {"type": "string", "format": "date"}}, "required": ["name"]}
    prompt, output = WORDS + DATE + WORDS, [1, 2, 3]
    assert _draft(New(), _grammar_state(prompt, output, schema=schema)) == DATE[:4]
    assert _draft(New(grammar_lookup=False), _grammar_state(prompt, output, schema=schema)) == []


def test_the_lookup_leaves_short_spans_and_free_text_alone():
    # An integer: the longest span the grammar takes is the year (4 tokens), too short to tell an
    # age from a year. A free string: nearly every prompt token fits, so no span is evidence.
    integer = {"type": "object", "properties": {"name": {"type": "integer"}}, "required": ["name"]}
    assert _draft(New(), _grammar_state(WORDS + DATE + WORDS, [1, 2, 19], schema=integer)) == []
    text = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert _draft(New(), _grammar_state(WORDS + DATE + WORDS, [1, 2, 3], schema=text)) == []


def test_an_earlier_output_under_the_same_constraint_gives_its_layout_not_its_values():
    from grammar import GrammarMatcher

    optional = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"}}}
    compiled = _compiled(optional)
    drafter = New()
    past = [1, 2, 3, 4, 11, 12, 3, 8, 13]  # '{"name":"Mar","city":"Mad"}'
    finished = SimpleNamespace(rid="p", grammar=GrammarMatcher(compiled), finished=True, output_ids=past, to_abort=None)
    drafter.release(finished)
    # This request's name ends like the earlier city: the earlier output closed the object there.
    assert _draft(drafter, _grammar_state([17], [1, 2, 3, 8], compiled=compiled)) == [13]
    assert _draft(New(history=False), _grammar_state([17], [1, 2, 3, 8], compiled=compiled)) == []
    # A sampled request drafts from itself alone: its draws must not depend on earlier requests.
    assert _draft(drafter, _grammar_state([17], [1, 2, 3, 8], compiled=compiled, greedy=False)) == []
    # At the start of a value the earlier output's value ("Mar") is another record's: not drafted.
    assert _draft(drafter, _grammar_state([17], [1, 2, 3], compiled=compiled)) == []
    # Another constraint (where '"}' would fit as well) has no history.
    other = {"type": "object", "properties": {"name": {"type": "string"}}}
    assert _draft(drafter, _grammar_state([17], [1, 2, 3, 8], schema=other)) == []
