"""Tests of grammar/regex.py: IR per construct, errors with positions, and an oracle against ``re``.

The oracle uses a tiny private reference matcher over the IR (sets of end positions), so it
does not depend on fsm.py / compiler.py; tests/test_regex_oracle.py does the token-level walk.
"""

from __future__ import annotations

import itertools
import re
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grammar import ir
from grammar.errors import GrammarBudgetError, GrammarError, RegexSyntaxError, UnsupportedFeatureError
from grammar.charsets import ECMA_WHITESPACE
from grammar.regex import regex_to_ir

# ---------------------------------------------------------------- reference matcher over the IR


def _ends(expr: ir.Expr, s: str, i: int) -> set[int]:
    """End positions of the matches of ``expr`` in ``s`` that start at ``i``."""
    if isinstance(expr, ir.Empty):
        return {i}
    if isinstance(expr, ir.Nothing):
        return set()
    if isinstance(expr, ir.Literal):
        text = expr.data.decode("utf-8")
        return {i + len(text)} if s.startswith(text, i) else set()
    if isinstance(expr, ir.CharClass):
        if i < len(s) and any(lo <= ord(s[i]) <= hi for lo, hi in expr.ranges):
            return {i + 1}
        return set()
    if isinstance(expr, ir.Seq):
        cur = {i}
        for item in expr.items:
            cur = {e for j in cur for e in _ends(item, s, j)}
        return cur
    if isinstance(expr, ir.Choice):
        return {e for item in expr.items for e in _ends(item, s, i)}
    if isinstance(expr, ir.Repeat):
        return _repeat_ends(expr, s, i)
    if isinstance(expr, ir.Graph):  # automata from char_dfa (inner anchors, lookaheads)
        seen, todo, out = {(expr.start, i)}, [(expr.start, i)], set()
        while todo:
            node, j = todo.pop()
            if node in expr.finals:
                out.add(j)
            for a, x, b in expr.edges:
                for k in _ends(x, s, j) if a == node else ():
                    if (b, k) not in seen:
                        seen.add((b, k))
                        todo.append((b, k))
        return out
    raise AssertionError(f"unexpected IR node {expr!r}")


def _repeat_ends(expr: ir.Repeat, s: str, i: int) -> set[int]:
    cur, out, k = {i}, set(), 0
    if expr.min == 0:
        out.add(i)
    while cur and (expr.max is None or k < expr.max):
        cur = {e for j in cur for e in _ends(expr.item, s, j)}
        k += 1
        if k >= expr.min:
            if expr.max is None:
                cur -= out  # positions already reached cannot lead anywhere new
            out |= cur
    return out


def ir_fullmatch(expr: ir.Expr, s: str) -> bool:
    return len(s) in _ends(expr, s, 0)


def check(pattern: str, passing: list[str], failing: list[str], **kw) -> None:
    expr = regex_to_ir(pattern, **kw)
    for s in passing:
        assert ir_fullmatch(expr, s), (pattern, s)
    for s in failing:
        assert not ir_fullmatch(expr, s), (pattern, s)


# ---------------------------------------------------------------- IR shape per construct

CC = ir.CharClass
L = ir.Literal
ANY_BUT_NL = ir.char_class([(10, 10)], negate=True)

IR_TABLE = [
    ("abc", L(b"abc")),
    ("", ir.EMPTY),
    ("a|b|[d-f]", CC(((97, 98), (100, 102)))),
    ("ab|c", ir.Choice((L(b"ab"), L(b"c")))),
    ("a*", ir.Repeat(L(b"a"), 0, None)),
    ("a+?", ir.Repeat(L(b"a"), 1, None)),
    ("a??", ir.Repeat(L(b"a"), 0, 1)),
    ("a{3}", ir.Repeat(L(b"a"), 3, 3)),
    ("a{2,}", ir.Repeat(L(b"a"), 2, None)),
    ("a{,4}", ir.Repeat(L(b"a"), 0, 4)),
    ("a{,}", ir.Repeat(L(b"a"), 0, None)),
    ("a{2,5}?", ir.Repeat(L(b"a"), 2, 5)),
    ("ab*", ir.Seq((L(b"a"), ir.Repeat(L(b"b"), 0, None)))),
    ("(ab)*", ir.Repeat(L(b"ab"), 0, None)),
    ("(?:ab)+", ir.Repeat(L(b"ab"), 1, None)),
    ("(?P<x>a)b", L(b"ab")),
    ("a{", L(b"a{")),
    ("a{}", L(b"a{}")),
    ("a{1,b}", L(b"a{1,b}")),
    ("a{ 1}", L(b"a{ 1}")),
    ("x}]", L(b"x}]")),
    ("[a-c]", CC(((97, 99),))),
    ("[]a]", CC(((93, 93), (97, 97)))),
    ("[\\]]", L(b"]")),
    ("[a-]", CC(((45, 45), (97, 97)))),
    ("[-a]", CC(((45, 45), (97, 97)))),
    ("[\\d_]", CC(((48, 57), (95, 95)))),
    ("[^\\x00-\\x7f]", CC(((0x80, 0xD7FF), (0xE000, 0x10FFFF)))),
    ("[é-ü]", CC(((0xE9, 0xFC),))),
    ("\\d", CC(((48, 57),))),
    ("\\w", CC(((48, 57), (65, 90), (95, 95), (97, 122)))),
    ("\\s", CC(((9, 13), (32, 32)))),
    ("\\D", ir.char_class([(48, 57)], negate=True)),
    (".", ANY_BUT_NL),
    ("(?s).", ir.ANY_CHAR),
    ("(?s:.)", ir.ANY_CHAR),
    ("\\x41\\u00e9\\U0001F600\\N{EM DASH}", L("Aé😀—".encode())),
    ("\\0\\07\\101\\a\\f\\n\\r\\t\\v\\\\\\.\\-", L(b"\x00\x07A\x07\x0c\n\r\t\x0b\\.-")),
    ("[\\b]", L(b"\x08")),
    ("[\\1\\12]", CC(((1, 1), (10, 10)))),
    ("(?i)a1", ir.Seq((CC(((65, 65), (97, 97))), L(b"1")))),
    ("(?i)[x-}]", CC(((0x58, 0x5A), (0x78, 0x7D)))),
    ("(?i:a)b", ir.Seq((CC(((65, 65), (97, 97))), L(b"b")))),
    ("(?i)é", L("é".encode())),
    ("(?x) a b  # comment\n c", L(b"abc")),
    ("(?x)a[ ]b", L(b"a b")),
    ("(?x)a\\ b", L(b"a b")),
    ("a(?#comment)b", L(b"ab")),
    ("^ab$", L(b"ab")),
    ("\\Aab\\Z", L(b"ab")),
    ("^a|b$", CC(((97, 98),))),
    ("^$", ir.EMPTY),
    ("\\ud800", ir.NOTHING),
]


@pytest.mark.parametrize("pattern,expected", IR_TABLE)
def test_ir_shape(pattern: str, expected: ir.Expr) -> None:
    assert regex_to_ir(pattern) == expected


def test_ignore_case_argument_folds_ascii_only() -> None:
    assert regex_to_ir("k", ignore_case=True) == CC(((75, 75), (107, 107)))
    # re.ASCII | re.IGNORECASE: the Kelvin sign U+212A does not fold to k.
    check("k", ["k", "K"], ["\u212a"], ignore_case=True)
    check("[^a]", ["b"], ["a", "A"], ignore_case=True)


# ---------------------------------------------------------------- ECMA flavor

ECMA_IR_TABLE = [
    ("\\u00e9\\u{1F600}", L("é😀".encode())),
    ("\\ud83d\\ude00", L("😀".encode())),
    ("[^]", ir.ANY_CHAR),
    ("[]", ir.NOTHING),
    ("\\cJ\\0", L(b"\n\x00")),
    ("(?<year>\\d)", CC(((48, 57),))),
    ("\\s", CC(ECMA_WHITESPACE)),
    (".", ir.char_class([(10, 10), (13, 13), (0x2028, 0x2029)], negate=True)),
    ("a{,3}", L(b"a{,3}")),
    ("\\/\\-", L(b"/-")),
    ("[\\b]", L(b"\x08")),
    ("[\\d-.]", CC(((45, 46), (48, 57)))),  # Annex B: a class escape makes '-' literal
    ("[a-\\s]", ir.char_class([(45, 45), (97, 97), *ECMA_WHITESPACE])),
]


@pytest.mark.parametrize("pattern,expected", ECMA_IR_TABLE)
def test_ecma_ir_shape(pattern: str, expected: ir.Expr) -> None:
    assert regex_to_ir(pattern, flavor="ecma") == expected


def test_ecma_whitespace_set() -> None:
    for ch in " \t\n\r\v\f\u00a0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\ufeff":
        check("\\s", [ch], [], flavor="ecma")
    for ch in "a\u0085\u180e\u200b":  # not ECMA whitespace
        check("\\s", [], [ch], flavor="ecma")
        check("\\S", [ch], [], flavor="ecma")


@pytest.mark.parametrize(
    "pattern,passing,failing",
    [
        ("\\p{L}+", ["abc", "éΩж", "漢字"], ["a1", "_", " "]),
        ("\\p{Letter}\\p{Nd}", ["a1", "ж٣"], ["11", "aa"]),
        ("[\\p{Lu}_]", ["A", "Ж", "_"], ["a", "ж"]),
        ("\\P{L}", ["1", " ", "😀"], ["a", "ж"]),
        ("[^\\P{gc=N}]", ["1", "٣", "½"], ["a"]),
        ("\\p{ASCII}\\p{Any}", ["a\U0001F600", "~\n"], ["éa"]),
    ],
)
def test_ecma_unicode_properties(pattern: str, passing: list[str], failing: list[str]) -> None:
    check(pattern, passing, failing, flavor="ecma")


# ---------------------------------------------------------------- search mode


@pytest.mark.parametrize(
    "pattern,passing,failing",
    [
        ("^ab|cd$", ["ab", "abzz", "zzcd", "cd", "ab\ncd"], ["zab", "cdz", ""]),
        ("b", ["b", "abc", "\nb\n"], ["", "a"]),
        ("^$", [""], ["a"]),
        ("^", ["", "abc"], []),
        ("^a$", ["a"], ["a\n", "aa"]),
    ],
)
def test_search_mode_ecma(pattern: str, passing: list[str], failing: list[str]) -> None:
    check(pattern, passing, failing, flavor="ecma", mode="search")


@pytest.mark.parametrize("pattern", ["^ab|cd$", "a$", "(?m)^a$", "(?m)a$", "\\Aa\\Z", "(?m)^a", "x", "^", "$", "(?m)$^"])
def test_search_mode_python_matches_re_search(pattern: str) -> None:
    expr = regex_to_ir(pattern, mode="search")
    for s in ["", "a", "a\n", "\na", "ba", "ab", "a\nb", "b\na\n", "x", "cd\n", "zab", "ab\n\n"]:
        assert ir_fullmatch(expr, s) == (re.search(pattern, s, re.ASCII) is not None), (pattern, s)


# ---------------------------------------------------------------- errors with positions

SYNTAX_ERRORS = [
    ("(a", 0),
    ("a)", 1),
    ("a(b(c)", 1),
    ("*a", 0),
    ("a|*", 2),
    ("a**", 2),
    ("a{2}{3}", 4),
    ("^*", 1),
    ("[z-a]", 1),
    ("[a", 0),
    ("[]", 0),
    ("[\\d-z]", 1),
    ("a{3,2}", 2),
    ("\\", 0),
    ("\\q", 0),
    ("\\x4", 0),
    ("\\u12", 0),
    ("\\U00110000", 0),
    ("\\N{NO SUCH CHAR}", 0),
    ("\\400", 0),
    ("[\\8]", 1),
    ("\\2(a)", 1),
    ("(a\\1)", 2),
    ("(?P<1>a)", 4),
    ("(?P<a>x)(?P<a>y)", 8),
    ("(?P=nope)", 0),
    ("(?", 2),
    ("(?Q)", 0),
    ("(?<x>a)", 0),
    ("a(?i)", 1),
    ("(?i", 3),
    ("(?i-:a)", 4),
    ("(?#abc", 0),
]


@pytest.mark.parametrize("pattern,position", SYNTAX_ERRORS)
def test_syntax_errors_with_position(pattern: str, position: int) -> None:
    with pytest.raises(RegexSyntaxError) as info:
        regex_to_ir(pattern)
    assert info.value.position == position
    assert f"position {position}" in str(info.value)
    with pytest.raises(re.error):
        re.compile(pattern, re.ASCII)


UNSUPPORTED = [
    ("a(?=b)", 1, "lookahead"),
    ("a(?!b)", 1, "lookahead"),
    ("(a(?!b))", 2, "lookahead"),
    ("(?=a)*", 5, "lookahead"),
    ("(?<=a)b", 0, "lookbehind"),
    ("(?<!a)b", 0, "lookbehind"),
    ("(a)\\1", 3, "backreference"),
    ("(?P<n>a)(?P=n)", 8, "backreference"),
    ("(a)?(?(1)b|c)", 4, "conditional"),
    ("\\bfoo", 0, "word boundary"),
    ("a\\B", 1, "word boundary"),
    ("(?>ab)", 0, "atomic"),
    ("a*+", 1, "possessive"),
    ("a{1,2}+", 1, "possessive"),
    ("a$b", 1, "anchor"),  # Python's $ also matches before a final newline: only at the end
    ("(?m)(^a)", 5, "anchor"),
    ("(?u)a", 2, "flag"),
]


@pytest.mark.parametrize("pattern,position,word", UNSUPPORTED)
def test_unsupported_constructs(pattern: str, position: int, word: str) -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        regex_to_ir(pattern)
    assert info.value.position == position
    assert word in str(info.value)


@pytest.mark.parametrize(
    "pattern",
    ["(?P<a>x)", "\\Z", "\\A", "a{,3}x", "\\1", "\\k<a>", "\\q", "\\p{Script=Latin}", "\\p{Foo}", "\\pL", "[z-a]", "a**", "\\x4",
     "\\u{110000}", "\\c1", "(?i)a", "\\00"],
)
def test_ecma_rejects(pattern: str) -> None:
    if pattern == "a{,3}x":
        assert regex_to_ir(pattern, flavor="ecma") == L(b"a{,3}x")  # literal braces in ECMA
        return
    with pytest.raises(GrammarError):
        regex_to_ir(pattern, flavor="ecma")


# Everything re.compile(p, re.ASCII) rejects, regex_to_ir rejects too.
RE_REJECTS = [
    "(", ")", "[", "[]", "[^]", "a**", "a++?", "a{2}*", "?", "+a", "{1}", "a|?", "(?", "(?P", "(?P<", "(?P<>a)",
    "(?P<a-b>x)", "(?P=", "(?<a>x)", "(?'a'x)", "(?z)", "(?i-i:a)", "(?-i)", "(?iL)", "(?au)", "(?a-a:x)", "x(?i)",
    "a|(?x)b", "((?s)a)", "[b-a]", "[a-\\w]", "[\\w-a]", "\\", "[\\", "\\c", "\\e", "\\g<1>", "\\x", "\\xg1",
    "\\u00g1", "\\U0011FFFF", "\\N", "\\N{", "\\N{}", "\\N{LATIN}", "\\9", "\\10", "(a)\\2", "(a\\1)", "\\777",
    "[\\9]", "[\\A]", "[\\Z]", "[\\B]", "[\\q]", "a{5,3}", "(?#", "(?(1)a)", "(?(x)a)", "(?<x)", "(?P>x)",
    "(?P<1a>x)", "(?P<a>x)(?P<a>y)", "(?P=a)", "(?P=1)", "(?i", "(?i-", "(?i-s", "(?i-s)", "(?x)a(?#",
]


@pytest.mark.parametrize("pattern", RE_REJECTS)
def test_rejects_what_re_rejects(pattern: str) -> None:
    with pytest.raises(re.error):
        re.compile(pattern, re.ASCII)
    with pytest.raises(GrammarError):
        regex_to_ir(pattern)


# ---------------------------------------------------------------- hostile input


def test_deep_nesting_is_a_budget_error_not_a_recursion_error() -> None:
    pattern = "(" * 5000 + "a" + ")" * 5000
    with pytest.raises(GrammarBudgetError, match="max_depth"):
        regex_to_ir(pattern)
    assert regex_to_ir("(" * 50 + "a" + ")*" * 50, max_depth=60) is not None
    with pytest.raises(GrammarBudgetError):
        regex_to_ir("((a))", max_depth=1)


def test_repeat_bound_budget() -> None:
    with pytest.raises(GrammarBudgetError, match="max_repeat"):
        regex_to_ir("a{100001}")
    with pytest.raises(GrammarBudgetError):
        regex_to_ir("a{1,99999999999999999999}")
    with pytest.raises(GrammarBudgetError):
        regex_to_ir("a{11}", max_repeat=10)
    assert regex_to_ir("a{100000}") == ir.Repeat(L(b"a"), 100000, 100000)


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        regex_to_ir("a", flavor="pcre")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        regex_to_ir("a", mode="match")  # type: ignore[arg-type]


# ---------------------------------------------------------------- oracle against re.fullmatch

_ATOMS = ["a", "b", "ab", ".", "\\d", "\\w", "\\s", "\\W", "[ab]", "[^a]", "[a-c\\d]", "\\.", "é", "\\n", "[^\\s]"]


def _regexes() -> st.SearchStrategy[str]:
    atom = st.sampled_from(_ATOMS)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        quant = st.sampled_from(["*", "+", "?", "{2}", "{1,2}", "{,2}", "{2,}", "*?", "??"])
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map("|".join),
            inner.map(lambda r: f"({r})"),
            inner.map(lambda r: f"(?:{r})"),
            inner.map(lambda r: f"(?i:{r})"),
            inner.map(lambda r: f"(?s:{r})"),
            st.tuples(inner.map(lambda r: f"(?:{r})"), quant).map("".join),
        )

    return st.recursive(atom, extend, max_leaves=6)


_TEXT = st.text(alphabet="abcAB1 \n._é-", max_size=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_regexes(), st.lists(_TEXT, min_size=1, max_size=6))
def test_oracle_random_strings(pattern: str, texts: list[str]) -> None:
    expr = regex_to_ir(pattern)
    for s in texts:
        assert ir_fullmatch(expr, s) == (re.fullmatch(pattern, s, re.ASCII) is not None), (pattern, s)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data())
def test_oracle_sampled_strings(data: st.DataObject) -> None:
    pattern = data.draw(_regexes())
    s = data.draw(st.from_regex(re.compile(pattern, re.ASCII), fullmatch=True, alphabet="abcAB1 \n._é-"))
    assert ir_fullmatch(regex_to_ir(pattern), s)
    assert ir_fullmatch(regex_to_ir(pattern, mode="search"), "x\n" + s + "\nz")


ZERO_WIDTH = ["a^b", "(^a|b)c", "a$|^b", "x(a$|b)", "(^|x)ab", "a\\Zb", "(?:\\Aa|b)", "^(?!ab)[a-c]+$", "(?!ab)[a-c]+",
              "^(?=a)[a-c]{2}$", "(?!a)b", "^(?!.*aa)[ab]*$", "(?=.*b)(?!.*c)^a", "(?=a)|b"]


@pytest.mark.parametrize("pattern", ZERO_WIDTH)
def test_inner_anchors_and_leading_lookaheads_agree_with_re(pattern: str) -> None:
    # Python's $ also matches before a final newline (refused inside groups): ECMA's $ is strict
    # and agrees with re on text without newlines.
    flavor = "ecma" if "$" in pattern else "python"
    full, search = regex_to_ir(pattern, flavor=flavor), regex_to_ir(pattern, flavor=flavor, mode="search")
    words = ["".join(t) for n in range(5) for t in itertools.product("abcx", repeat=n)]
    for s in words + ([] if flavor == "ecma" else ["a\n", "\nb"]):
        assert ir_fullmatch(full, s) == (re.fullmatch(pattern, s) is not None), (pattern, s)
        assert ir_fullmatch(search, s) == (re.search(pattern, s) is not None), (pattern, s)


# ---------------------------------------------------------------- random syntax against re

_META = list("ab()|*+?{},012[]^-\\.$:P<>=!#ixsmdwWSAZbBn") + ["(?", "(?:", "(?P<n>", "\\d", "[^", "{2}", "{1,2}", "(?i)", "\\x41", "é"]
_PROBES = ["", "a", "b", "ab", "aa", "ba", "abab", "a\n", "1", "{", "}", "a{", "(", "é", "A", "-", "aab", "\\", "]", "0", "12"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_META), min_size=1, max_size=12).map("".join))
def test_random_syntax_agrees_with_re(pattern: str) -> None:
    """Junk patterns: a syntax error exactly when re has one; otherwise the same language
    (fullmatch and search), unless the construct is refused as unsupported."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re's FutureWarning about possible set operations
        try:
            compiled: re.Pattern[str] | None = re.compile(pattern, re.ASCII)
        except (re.error, OverflowError):
            compiled = None
    try:
        full, search = regex_to_ir(pattern), regex_to_ir(pattern, mode="search")
    except RegexSyntaxError:
        assert compiled is None, pattern
        return
    except (UnsupportedFeatureError, GrammarBudgetError):
        return
    assert compiled is not None, pattern
    for s in _PROBES:
        assert ir_fullmatch(full, s) == (compiled.fullmatch(s) is not None), (pattern, s)
        assert ir_fullmatch(search, s) == (compiled.search(s) is not None), (pattern, s)
