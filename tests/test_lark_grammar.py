"""Lark front end: imports, %ignore, regex terminals, left recursion, errors."""

from __future__ import annotations

import pytest

from grammar import GrammarMatcher, TokenVocabulary, compile_grammar
from grammar.errors import GrammarError, GrammarSyntaxError, UnsupportedFeatureError
from grammar.lark_grammar import lark_to_grammar

VOCAB = TokenVocabulary.byte_level()


def check(text: str, passing: list[str], failing: list[str], start: str = "start") -> None:
    compiled = compile_grammar(lark_to_grammar(text, start=start), VOCAB)
    for doc in passing + failing:
        m = GrammarMatcher(compiled)
        assert (m.accept_bytes(doc) and m.can_terminate()) == (doc in passing), doc


CALC = """
?start: sum
?sum: product | sum "+" product -> add | sum "-" product -> sub
?product: atom | product "*" atom
?atom: NUMBER | "-" atom | "(" sum ")" | NAME
%import common.NUMBER
%import common.CNAME -> NAME
%import common.WS_INLINE
%ignore WS_INLINE
"""


def test_common_imports_ignore_and_left_recursion() -> None:
    check(CALC, ["1", "1+2", " 1 + 2 * ( x - 3.5e2 ) ", "-a*b", "1\t+\t2"], ["", "1+", "1 2", "(1", "1\n+2"])


def test_ignore_between_tokens_only_not_inside_terminals() -> None:
    text = 'start: WORD ("," WORD)*\nWORD: /[a-z]+/\n%ignore " "'
    check(text, ["ab", "ab , cd", " ab,cd "], ["a b", "ab,,cd"])


def test_regex_terminal_with_case_insensitive_flag_and_string_flag() -> None:
    text = 'start: KW " " ID\nKW: "select"i\nID: /[a-z]+/i'
    check(text, ["select abc", "SeLeCt ABC"], ["selec abc", "select 123"])


def test_dotall_and_verbose_flags() -> None:
    text = 'start: A B\nA: /a.b/s\nB: / c + d /x'
    check(text, ["a\nbccd", "axbcd"], ["a\nb cd", "ab"])


def test_templates_and_custom_start() -> None:
    text = '_sep{x, sep}: x (sep x)*\nlist: "[" _sep{ITEM, ","} "]"\nITEM: "a" | "b"'
    check(text, ["[a]", "[a,b,a]"], ["[]", "[a,]"], start="list")


def test_rule_operators_and_empty_alternative() -> None:
    text = 'start: "x"~2..3 y? z+\ny: "y"\nz: "z" |'
    check(text, ["xx", "xxxyz", "xxzzz"], ["x", "xxxx"])


def test_terminal_with_lookahead_is_refused() -> None:
    with pytest.raises(UnsupportedFeatureError):
        lark_to_grammar('start: A\nA: /a(?=b)/')


@pytest.mark.parametrize(
    "text, start, message",
    [
        ("start: a", "start", "not defined"),
        ("start x", "start", "missing colon"),
        ('start: "a"', "other", "other"),
        ('start: start "a"', "start", "language is empty"),
        ('start: a\na: o b "x" | "q"\nb: a "y" | "z"\no: "o"?', "start", "left-recursive"),
    ],
)
def test_errors(text: str, start: str, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        lark_to_grammar(text, start=start)


def test_indirect_left_recursion_is_rewritten() -> None:
    check('start: a\na: b "x" | "y"\nb: a "z" | "w"', ["y", "wx", "yzx", "wxzx"], ["", "w", "yz"])


def test_syntax_error_carries_position() -> None:
    with pytest.raises(GrammarSyntaxError) as info:
        lark_to_grammar('start: "a"\nstart x')
    assert info.value.line == 2
