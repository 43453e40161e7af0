"""EBNF text -> grammar IR: the XGrammar / llama.cpp GBNF dialect that SGLang's ``ebnf`` field takes.

Dialect (checked against xgrammar 0.2.9's parser)::

    root    ::= value ("," value)*      # comments run to the end of the line
    value   ::= "lit\\n\\x41\\u00e9" | [a-z_] [^"\\\\]* | ( "(" value ")" ){1,3} | name?
    name    ::= [\\U0001F600-\\U0001F64F]+

- A rule is ``name ::= body``; the body may span lines and ends where the next ``name ::=`` starts.
  Names are ``[A-Za-z_][A-Za-z0-9_.-]*``.
- Strings ``"..."`` and classes ``[...]``/``[^...]`` take the escapes ``\\n \\r \\t \\v \\f \\0 \\e
  \\\\ \\" \\' \\] \\[ \\- \\^ \\xH.. \\uHHHH \\UHHHHHHHH``. ``\\x`` names a code point (encoded as UTF-8
  like every other character) and, as in XGrammar (unlike llama.cpp's exactly-two-digit rule),
  takes every hex digit that follows: ``"\\x41b"`` is U+041B; write ``"\\x41" "b"`` for ``Ab``.
- Postfix ``* + ? {m} {m,} {m,n}``; grouping ``( )`` (``()`` is the empty string); ``|``.
- A lookahead assertion ``(= ...)`` at the end of a rule body is accepted only where it is implied by
  the grammar (every use of the rule is directly followed by text starting with the asserted literal);
  otherwise it is refused with ``UnsupportedFeatureError``, since the automaton cannot enforce it.
- XGrammar's ``TagDispatch(...)`` macro is refused with ``UnsupportedFeatureError``.

Checks: syntax errors, duplicate and undefined rules, a missing root and an empty language raise
``GrammarSyntaxError`` with line and column. Left recursion is rewritten into iteration by
:func:`grammar_checks.eliminate_left_recursion` (shared with the Lark front end): direct
(``A ::= A x | A y | b | c``  ->  ``A ::= (b | c) (x | y)*``), inside leading groups and options,
and indirect through other rules; left recursion that remains (through a nullable prefix such as
``A ::= ws? A x``, or a cycle whose rewrite passes ``grammar_checks.REWRITE_ALTERNATIVES``) is
refused with the rule's position.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from . import ir
from .budget import charge
from .trie_choice import trie_choice
from .errors import GrammarSyntaxError, UnsupportedFeatureError

_NAME_START = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NAME_CHARS = _NAME_START | set("0123456789.-")
_SIMPLE_ESCAPES = {
    "n": "\n", "r": "\r", "t": "\t", "v": "\v", "f": "\f", "0": "\0", "e": "\x1b", "a": "\a", "b": "\b",
    "\\": "\\", '"': '"', "'": "'", "]": "]", "[": "[", "-": "-", "^": "^", "/": "/",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_HEX_DIGITS = set("0123456789abcdefABCDEF")


@dataclass(frozen=True)
class SourcePos:
    """Where a rule or reference was written (1-based), for error messages."""

    line: int
    column: int


class _Parser:
    """Recursive descent over the text with an explicit cursor; nesting depth is bounded by the
    grammar text itself (parentheses), not by input documents."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rules: dict[str, ir.Expr] = {}
        self.rule_pos: dict[str, SourcePos] = {}
        self.ref_pos: list[tuple[str, str, SourcePos]] = []  # (referenced, in rule, where)
        self.lookaheads: dict[str, tuple[ir.Expr, SourcePos]] = {}
        self.current = ""
        self._line_starts: list[int] | None = None

    # -- positions and errors
    def where(self, pos: int | None = None) -> SourcePos:
        p = self.pos if pos is None else pos
        if self._line_starts is None:  # found once: counting newlines per lookup is quadratic
            self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        line = bisect.bisect_right(self._line_starts, p)
        return SourcePos(line, p - self._line_starts[line - 1] + 1)

    def error(self, message: str, pos: int | None = None) -> GrammarSyntaxError:
        w = self.where(pos)
        return GrammarSyntaxError(message, w.line, w.column)

    # -- lexical helpers
    def skip_space(self) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in " \t\r\n":
                self.pos += 1
            elif c == "#":
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            else:
                break

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def name_at(self, pos: int) -> str:
        text, end = self.text, pos
        if end < len(text) and text[end] in _NAME_START:
            end += 1
            while end < len(text) and text[end] in _NAME_CHARS:
                end += 1
        return text[pos:end]

    def starts_rule(self) -> bool:
        """Is the cursor at ``name ::=`` (the start of the next rule)?"""
        name = self.name_at(self.pos)
        if not name:
            return False
        save = self.pos
        self.pos += len(name)
        self.skip_space()
        found = self.text.startswith("::=", self.pos)
        self.pos = save
        return found

    # -- grammar structure
    def parse(self) -> None:
        self.skip_space()
        while self.pos < len(self.text):
            start = self.pos
            self.parse_rule()
            charge("parsing the EBNF grammar", self.pos - start)
            self.skip_space()

    def parse_rule(self) -> None:
        start = self.pos
        name = self.name_at(self.pos)
        if not name:
            raise self.error(f"expected a rule name, found {self.peek()!r}")
        self.pos += len(name)
        self.skip_space()
        if not self.text.startswith("::=", self.pos):
            raise self.error(f"expected '::=' after rule name {name!r}")
        if name in self.rules:
            raise self.error(f"rule {name!r} is defined more than once", start)
        self.pos += 3
        self.current = name
        self.rule_pos[name] = self.where(start)
        self.rules[name] = ir.NOTHING  # placeholder so self-references resolve
        self.rules[name] = self.parse_choice(top=True)

    def parse_choice(self, top: bool = False) -> ir.Expr:
        alts = [self.parse_seq(top)]
        while True:
            self.skip_space()
            if self.peek() != "|":
                break
            self.pos += 1
            alts.append(self.parse_seq(top))
        # A Choice whose items begin with Ref(rule) is how eliminate_left_recursion spots `A ::= A x | b`
        # (trie_choice folds only ref-free alternatives, so those stay as they are).
        return trie_choice(*alts)

    def parse_seq(self, top: bool) -> ir.Expr:
        items: list[ir.Expr] = []
        while True:
            self.skip_space()
            c = self.peek()
            if c == "" or c in "|)" or (c in _NAME_START and self.starts_rule()):
                break
            if self.text.startswith("(=", self.pos):
                self.parse_lookahead(top)
                break
            items.append(self.parse_postfix())
        if not items:
            raise self.error("expected an element (string, class, rule name or group)")
        return ir.seq(*items)

    def parse_lookahead(self, top: bool) -> None:
        start = self.pos
        if not top:
            raise self.error("a lookahead assertion '(= ...)' may only end a rule body")
        self.pos += 2
        body = self.parse_choice()
        self.skip_space()
        if self.peek() != ")":
            raise self.error("expected ')' closing the lookahead assertion")
        self.pos += 1
        self.skip_space()
        if self.pos < len(self.text) and not self.starts_rule():
            raise self.error("a lookahead assertion '(= ...)' may only end a rule body")
        self.lookaheads[self.current] = (body, self.where(start))

    def parse_postfix(self) -> ir.Expr:
        expr = self.parse_primary()
        while True:
            self.skip_space()
            c = self.peek()
            if c in ("*", "+", "?"):
                self.pos += 1
                expr = {"*": ir.star, "+": ir.plus, "?": ir.optional}[c](expr)
            elif c == "{":
                lo, hi = self.parse_braces()
                expr = ir.repeat(expr, lo, hi)
            else:
                return expr

    def parse_int(self) -> int:
        self.skip_space()
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        if start == self.pos:
            raise self.error("expected an integer in a '{m,n}' repetition")
        return int(self.text[start:self.pos])

    def parse_braces(self) -> tuple[int, int | None]:
        start = self.pos
        self.pos += 1
        lo = self.parse_int()
        hi: int | None = lo
        self.skip_space()
        if self.peek() == ",":
            self.pos += 1
            self.skip_space()
            hi = None if self.peek() == "}" else self.parse_int()
            self.skip_space()
        if self.peek() != "}":
            raise self.error("expected '}' closing a repetition")
        self.pos += 1
        if hi is not None and hi < lo:
            raise self.error(f"repetition lower bound {lo} exceeds upper bound {hi}", start)
        return lo, hi

    def parse_primary(self) -> ir.Expr:
        c = self.peek()
        if c == '"':
            return ir.literal(self.parse_string())
        if c == "[":
            return self.parse_class()
        if c == "(":
            start = self.pos
            self.pos += 1
            self.skip_space()
            if self.peek() == ")":  # `()` is the empty string, as in XGrammar
                self.pos += 1
                return ir.EMPTY
            expr = self.parse_choice()
            self.skip_space()
            if self.peek() != ")":
                raise self.error(f"expected ')' closing the group opened at {self.where(start)}")
            self.pos += 1
            return expr
        name = self.name_at(self.pos)
        if name:
            if name == "TagDispatch" and self.text.startswith("(", self.pos + len(name)):
                w = self.where()
                raise UnsupportedFeatureError(
                    f"the TagDispatch(...) macro is not supported (line {w.line}, column {w.column}); "
                    "use compile_structural_tag"
                )
            self.ref_pos.append((name, self.current, self.where()))
            self.pos += len(name)
            return ir.Ref(name)
        if c == "":
            raise self.error("unexpected end of grammar, expected an element")
        raise self.error(f"unexpected character {c!r}")

    def parse_escape(self) -> str:
        """The cursor is after a backslash; return the escaped character."""
        start = self.pos - 1
        c = self.peek()
        if c in _SIMPLE_ESCAPES:
            self.pos += 1
            return _SIMPLE_ESCAPES[c]
        if c in _HEX_ESCAPES:
            if c == "x":  # XGrammar reads \x like C: every hex digit that follows (llama.cpp: two)
                end = self.pos + 1
                while end < len(self.text) and self.text[end] in _HEX_DIGITS:
                    end += 1
                digits = self.text[self.pos + 1:end]
            else:
                digits = self.text[self.pos + 1:self.pos + 1 + _HEX_ESCAPES[c]]
            if not digits or (c != "x" and len(digits) != _HEX_ESCAPES[c]) or any(d not in _HEX_DIGITS for d in digits):
                raise self.error(f"invalid \\{c} escape: expected {'hex digits' if c == 'x' else f'{_HEX_ESCAPES[c]} hex digits'}", start)
            value = int(digits, 16)
            if value > ir.MAX_UNICODE or ir.SURROGATES[0] <= value <= ir.SURROGATES[1]:
                raise self.error(f"escape \\{c}{digits} is not a Unicode scalar value", start)
            self.pos += 1 + len(digits)
            return chr(value)
        raise self.error(f"invalid escape sequence '\\{c}'", start)

    def parse_string(self) -> str:
        start = self.pos
        self.pos += 1
        out: list[str] = []
        while True:
            c = self.peek()
            if c == "" or c == "\n":
                raise self.error("unterminated string literal", start)
            self.pos += 1
            if c == '"':
                return "".join(out)
            out.append(self.parse_escape() if c == "\\" else c)

    def parse_class_char(self) -> str:
        c = self.peek()
        if c == "" or c == "\n":
            raise self.error("unterminated character class")
        self.pos += 1
        return self.parse_escape() if c == "\\" else c

    def parse_class(self) -> ir.Expr:
        self.pos += 1
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            lo_pos = self.pos
            lo = self.parse_class_char()
            hi = lo
            if self.peek() == "-" and self.text[self.pos + 1:self.pos + 2] not in ("]", ""):
                self.pos += 1
                hi = self.parse_class_char()
                if ord(hi) < ord(lo):
                    raise self.error(f"inverted range {lo!r}-{hi!r} in character class", lo_pos)
            ranges.append((ord(lo), ord(hi)))
        self.pos += 1
        return ir.char_class(ranges, negate=negate)


def ebnf_to_grammar(text: str, *, root: str = "root") -> ir.Grammar:
    """Parse XGrammar/GBNF-style EBNF ``text`` into an IR grammar whose start rule is ``root``.

    Raises GrammarSyntaxError (with line and column) for syntax errors, duplicate or undefined
    rules, a missing root, an empty language or left recursion that cannot be rewritten, and
    UnsupportedFeatureError for lookahead assertions that cannot be enforced exactly.
    """
    parser = _Parser(text)
    try:
        parser.parse()
    except RecursionError:
        # Group nesting in the grammar text itself (not input depth) recurses in the parser.
        raise GrammarSyntaxError("grammar text nests groups too deeply") from None
    for name, in_rule, pos in parser.ref_pos:
        if name not in parser.rules:
            raise GrammarSyntaxError(f"rule {name!r} (used in rule {in_rule!r}) is not defined", pos.line, pos.column)
    if root not in parser.rules:
        w = parser.where(len(text))
        raise GrammarSyntaxError(f"the root rule {root!r} is not defined", w.line, w.column)
    grammar = ir.Grammar(dict(parser.rules), root=root, source_kind="ebnf")
    _check_lookaheads(grammar, parser.lookaheads)
    return finish_grammar(grammar, parser.rule_pos)


def finish_grammar(grammar: ir.Grammar, positions: dict[str, SourcePos] | None = None) -> ir.Grammar:
    """Shared tail of the text front ends: rewrite direct left recursion, drop rules the root cannot
    reach, and check that the language is not empty and that no left recursion remains."""
    from .grammar_checks import check_grammar, eliminate_left_recursion, prune_unreachable

    grammar = eliminate_left_recursion(grammar)
    grammar = prune_unreachable(grammar)
    check_grammar(grammar, positions or {})
    return grammar


def _check_lookaheads(grammar: ir.Grammar, lookaheads: dict[str, tuple[ir.Expr, SourcePos]]) -> None:
    """Accept ``rule ::= body (= "lit")`` only when every use of ``rule`` is directly followed, in
    the same sequence, by literal text starting with ``lit``: then the assertion always holds and
    dropping it changes nothing. Anything else would need lookahead the automaton cannot do."""
    for name, (body, pos) in lookaheads.items():
        if not (isinstance(body, ir.Literal) and name != grammar.root and _lookahead_implied(grammar, name, body.data)):
            raise UnsupportedFeatureError(
                f"lookahead assertion on rule {name!r} (line {pos.line}, column {pos.column}) cannot be "
                "enforced exactly; formcast accepts '(= \"literal\")' only where the grammar already implies it"
            )


def _lookahead_implied(grammar: ir.Grammar, name: str, lit: bytes) -> bool:
    stack: list[ir.Expr] = list(grammar.rules.values())
    while stack:
        e = stack.pop()
        if isinstance(e, ir.Ref) and e.name == name:
            return False  # a use that is not an item of a sequence
        if isinstance(e, ir.Seq):
            for i, item in enumerate(e.items):
                if isinstance(item, ir.Ref) and item.name == name:
                    following = e.items[i + 1] if i + 1 < len(e.items) else None
                    if not (isinstance(following, ir.Literal) and following.data.startswith(lit)):
                        return False
                else:
                    stack.append(item)
        elif isinstance(e, ir.Choice):
            stack.extend(e.items)
        elif isinstance(e, ir.Repeat):
            stack.append(e.item)
    return True
