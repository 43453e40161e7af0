"""EBNF front end: the dialect, the IR it produces, error positions, left-recursion rewriting."""

from __future__ import annotations

import re

import pytest

from grammar import GrammarMatcher, TokenVocabulary, compile_grammar, ir
from grammar.ebnf import ebnf_to_grammar
from grammar.errors import GrammarSyntaxError, UnsupportedFeatureError

VOCAB = TokenVocabulary.byte_level()


def accepts(text: str, doc: str | bytes, root: str = "root") -> bool:
    """Byte by byte through the real matcher; each byte's mask bit must agree with accept_token."""
    matcher = GrammarMatcher(compile_grammar(ebnf_to_grammar(text, root=root), VOCAB))
    data = doc.encode() if isinstance(doc, str) else doc
    for b in data:
        allowed = bool(matcher.get_next_token_bitmask()[b // 32] >> (b % 32) & 1)
        assert matcher.accept_token(b) == allowed
        if not allowed:
            return False
    return matcher.accept_token(VOCAB.vocab_size - 1)


def check(text: str, passing: list[str], failing: list[str]) -> None:
    for doc in passing:
        assert accepts(text, doc), doc
    for doc in failing:
        assert not accepts(text, doc), doc


def test_literals_escapes_and_classes() -> None:
    g = 'root ::= "a\\n\\t\\"\\\\" "\\x41\\u00e9\\U0001F600" [^"\\\\a-z] [\\]\\-] [\\u00e0-\\u00ff]'
    check(g, ['a\n\t"\\Aé😀#]à', 'a\n\t"\\Aé😀Z-ÿ'], ['a\n\t"\\Aé😀a]à', 'a\n\t"\\Aé😀#xà', 'a\n\t"\\Aé😀"]à'])


def test_xHH_is_a_code_point_as_in_xgrammar() -> None:
    assert ebnf_to_grammar('root ::= "\\xe9"').rules["root"] == ir.Literal("é".encode())
    # Like XGrammar, \x takes every hex digit that follows (llama.cpp would read "\x41" "b").
    assert ebnf_to_grammar('root ::= "\\x41b\\x4"').rules["root"] == ir.Literal("\u041b\x04".encode())


def test_repetition_forms() -> None:
    g = 'root ::= "a"{2} "b"{1,} "c"{0,2} "d"* "e"+ "f"?'
    check(g, ["aabe", "aabbbccddeeef"], ["abe", "aab", "aabccce", "aabef f"])


def test_groups_alternation_comments_and_multiline_rules() -> None:
    g = """
    # a comment line
    root ::= ( "x" | "y" )+   # trailing comment with "quotes" and ::=
             tail
           | ()
    tail ::= "!" |
             "?"
    """
    check(g, ["x!", "yxy?", ""], ["x", "!", "xz!"])


def test_rule_names_with_dashes_and_dots() -> None:
    check('root ::= my-rule a.b\nmy-rule ::= "x"\na.b ::= "y"', ["xy"], ["x", "yx"])


def test_custom_root_and_unreachable_rules_pruned() -> None:
    g = ebnf_to_grammar('main ::= "m" other\nother ::= "o"\nunused ::= "u"', root="main")
    assert set(g.rules) == {"main", "other"} and g.root == "main"


def test_recursion_right_and_center() -> None:
    check('root ::= "(" root ")" | ""', ["", "()", "((()))"], ["(", "())", ")("])


def test_direct_left_recursion_is_rewritten() -> None:
    text = 'root ::= root "+" num | root "-" num | num\nnum ::= [0-9]+'
    g = ebnf_to_grammar(text)
    assert ir.Ref("root") not in list(ir.iter_refs(g.rules["root"]))
    check(text, ["1", "1+2-30", "12-3"], ["", "+1", "1+", "1+-2"])


@pytest.mark.parametrize(
    "text",
    [
        'root ::= (root "+")? num\nnum ::= [0-9]+',
        'root ::= (root "+" | root "-") num | num\nnum ::= [0-9]+',
        'root ::= ((root ("+" | "-"))? num)\nnum ::= [0-9]+',
    ],
)
def test_left_recursion_inside_leading_groups_is_rewritten(text: str) -> None:
    plus_only = '"-"' not in text
    check(text, ["1", "1+2", "1+2+33"] + ([] if plus_only else ["1-2+3"]), ["", "+1", "1+", "1++2"])


def test_indirect_left_recursion_is_rewritten() -> None:
    text = 'root ::= a\na ::= b "x" | "y"\nb ::= a "z" | "w"'
    # a = (y z | w)(x z)* x | y
    check(text, ["y", "wx", "yzx", "wxzx", "yzxzx"], ["", "w", "yz", "wxz", "x"])


def test_lookahead_implied_by_grammar_is_accepted() -> None:
    check('root ::= a "bc"\na ::= "x"+ (= "b")', ["xbc", "xxbc"], ["bc", "xb"])


@pytest.mark.parametrize(
    "text",
    ['root ::= a\na ::= "x" (= "y")', 'root ::= a "zz"\na ::= "x" (= "y")', 'root ::= "x" (= "y")'],
)
def test_lookahead_not_implied_is_refused(text: str) -> None:
    with pytest.raises(UnsupportedFeatureError, match="lookahead"):
        ebnf_to_grammar(text)


def test_tagdispatch_is_refused() -> None:
    with pytest.raises(UnsupportedFeatureError, match="TagDispatch"):
        ebnf_to_grammar('root ::= TagDispatch(("<a>", b))\nb ::= "x"')


@pytest.mark.parametrize(
    "text, message, line, column",
    [
        ('root ::= foo', "'foo'", 1, 10),
        ('root ::= "a"\nroot ::= "b"', "more than once", 2, 1),
        ('start ::= "a"', "root rule 'root' is not defined", 1, 14),
        ('root ::= "a" |', "expected an element", 1, 15),
        ('root ::= "abc', "unterminated string", 1, 10),
        ('root ::= [abc', "unterminated character class", 1, 14),
        ('root ::= "\\q"', "invalid escape", 1, 11),
        ('root ::= "\\u12"', "hex digits", 1, 11),
        ('root ::= [z-a]', "inverted range", 1, 11),
        ('root ::= "a"{3,1}', "exceeds upper bound", 1, 13),
        ('root ::= "a"{,3}', "expected an integer", 1, 14),
        ('root ::= ("a"', "expected ')'", 1, 14),
        ('root ::= "a" )', "expected a rule name", 1, 14),
        ('root ::= @', "unexpected character", 1, 10),
        ('\n\nroot ::= root "a"', "language is empty", 3, 1),
        ('root ::= [^\\u0000-\\U0010FFFF]', "language is empty", 1, 1),
        ('root ::= a\na ::= o b "x" | "q"\nb ::= a "y" | "z"\no ::= "o"?', "left-recursive", 2, 1),
        ('root ::= x\nx = "a"', "unexpected character '='", 2, 3),
    ],
)
def test_errors_name_line_and_column(text: str, message: str, line: int, column: int) -> None:
    with pytest.raises(GrammarSyntaxError, match=re.escape(message)) as info:
        ebnf_to_grammar(text)
    assert (info.value.line, info.value.column) == (line, column)


def test_indirect_left_recursion_through_nullable_prefix_is_refused() -> None:
    with pytest.raises(GrammarSyntaxError, match="left-recursive"):
        ebnf_to_grammar('root ::= opt root "x" | "y"\nopt ::= "o"?')


def test_deeply_nested_grammar_text_and_input() -> None:
    depth = 200
    text = "root ::= " + "(" * depth + '"x"' + ")" * depth
    check(text, ["x"], ["xx"])
    nested = 'root ::= "[" root? "]"'
    check(nested, ["[" * 600 + "]" * 600], ["[" * 600 + "]" * 599])


def test_absurdly_nested_grammar_text_is_a_syntax_error_not_a_crash() -> None:
    with pytest.raises(GrammarSyntaxError, match="too deeply"):
        ebnf_to_grammar("root ::= " + "(" * 5000 + '"x"' + ")" * 5000)


def test_rollback_and_forced_continuation_through_recursion() -> None:
    from grammar import compile_ebnf

    text = 'root ::= "SELECT " cols " FROM " [a-z]+\ncols ::= "*" | "(" cols ")"'
    m = GrammarMatcher(compile_ebnf(text, VOCAB))
    assert m.forced_continuation() == b"SELECT "
    assert m.accept_bytes("SELECT ((")
    assert m.forced_continuation() == b""  # "*" or another "("
    assert m.accept_bytes("*")
    assert m.forced_continuation() == b")) FROM "
    m.rollback(1)
    assert m.accept_bytes("(*")
    assert m.forced_continuation() == b"))) FROM "
    assert not m.accept_bytes("))) FROM 1")
    assert m.accept_bytes("))) FROM t") and m.can_terminate()
