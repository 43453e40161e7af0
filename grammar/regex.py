"""Regex front end: pattern text -> character-level grammar IR.

Two flavors share one hand-written parser:

- ``"python"``: Python ``re`` syntax with the meaning ``re.compile(p, re.ASCII)`` gives it
  (``\\d`` = ``[0-9]``, ``\\w`` = ``[A-Za-z0-9_]``, ``\\s`` = ``[ \\t\\n\\r\\f\\v]``, only ASCII
  letters fold under ``i``). Inline flags ``a i m s x`` (global at the start, or scoped
  ``(?i:...)``), verbose mode, named groups, comments, lazy quantifiers.
- ``"ecma"``: the ECMA-262 syntax JSON Schema ``pattern`` uses (``\\uXXXX``, surrogate pairs,
  ``\\u{...}``, ``\\cX``, ``[^]``, ``[]``, ``(?<name>...)``, the Unicode ``\\s`` set, ``.``
  excluding line terminators, ``\\p{...}`` General_Category escapes). Annex B leniency: a ``{``
  that is not a quantifier and a lone ``]`` / ``}`` are literals, ``[\\w-.]`` is a union; ``\\`` before any ASCII
  punctuation is an identity escape. ``ignore_case`` folds ASCII letters only (as Python's
  ``re.ASCII``), not ECMA's Unicode case mapping.

``mode="search"`` follows the flavor's anchors: Python's ``$`` also matches before a final
newline and ``(?m)`` makes ``^`` / ``$`` match at line breaks; ECMA's are strict.

Constructs whose language is not regular, or that depend on context we do not track
(lookbehind, backreferences, conditionals, word boundaries, atomic groups, possessive
quantifiers, lookaheads anywhere but the start of a top-level alternative, multiline anchors
inside groups), raise :class:`UnsupportedFeatureError`; malformed patterns raise
:class:`RegexSyntaxError` with the position. Every pattern ``re.compile(p, re.ASCII)`` rejects is
rejected here too.

Two zero-width constructs are exact through ``char_dfa`` (the pattern is determinized and handed
back as an ``ir.Graph``): strict anchors anywhere (``(^a|b$)``, ``a$|^b``), marked with
``char_dfa.START`` / ``END``; and lookaheads at the start of a top-level alternative
(``^(?!foo)\\w+``): the rest of the text from there intersected with, or minus, ``X.*``.

The parser uses an explicit stack of open groups, so nesting never recurses in Python;
nesting deeper than ``max_depth`` and repetition counts above ``max_repeat`` raise
:class:`GrammarBudgetError` (downstream IR consumers hash and walk expressions recursively,
so the IR depth must stay well below Python's recursion limit).

The output stays at character level (``Literal`` of UTF-8 text, ``CharClass`` of code points),
so the JSON Schema front end can rewrite characters into JSON string escapes.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field, replace
from typing import Literal as _Lit

from . import ir
from .budget import charge
from .trie_choice import trie_choice

# Characters that stand for themselves in every flavor (no syntax, no surrogates).
_PLAIN_RUN = re.compile(r"[^\\^$.|?*+()\[\]{}\ud800-\udfff]+")
from .charsets import ECMA_CLASSES, ECMA_LINE_TERMINATORS, PY_CLASSES, Ranges, ascii_fold, unicode_property
from .errors import GrammarBudgetError, RegexSyntaxError, UnsupportedFeatureError
from .ir import Expr

__all__ = ["regex_to_ir", "DEFAULT_MAX_DEPTH", "DEFAULT_MAX_REPEAT"]

DEFAULT_MAX_DEPTH = 200
DEFAULT_MAX_REPEAT = 100_000

_PY_ESCAPES = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92}
_ECMA_ESCAPES = {"f": 12, "n": 10, "r": 13, "t": 9, "v": 11}
_HEX = "0123456789abcdefABCDEF"
_OCT = "01234567"
_ASCII_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_VERBOSE_WS = " \t\n\r\v\f"
_ANY_STAR = ir.star(ir.ANY_CHAR)


@dataclass(frozen=True)
class _Flags:
    ignore_case: bool = False
    dotall: bool = False
    multiline: bool = False
    verbose: bool = False


@dataclass
class _Item:
    """One parsed atom of a sequence; ``kind`` drives quantifier and anchor checks."""

    expr: Expr
    pos: int
    kind: str  # "atom" | "group" | "repeat" | "start" | "end" (the last two: anchors)
    # Anchors only: "strict" (\A \Z, ECMA ^ $, ^ without m), "multiline" (^ $ under m),
    # "dollar" (Python's $ without m, which also matches before a final newline).
    anchor: str = "strict"


@dataclass
class _Frame:
    """An open group: finished alternatives plus the one being parsed."""

    pos: int
    outer_flags: _Flags
    group: int | None = None  # capture index, to know which groups are still open
    lookahead: str | None = None  # "=" or "!" for a lookahead group
    alts: list[list[_Item]] = field(default_factory=list)
    items: list[_Item] = field(default_factory=list)


def regex_to_ir(
    pattern: str,
    *,
    flavor: _Lit["python", "ecma"] = "python",
    mode: _Lit["fullmatch", "search"] = "fullmatch",
    ignore_case: bool = False,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_repeat: int = DEFAULT_MAX_REPEAT,
) -> Expr:
    """Lower ``pattern`` to a character-level IR expression.

    ``mode="fullmatch"`` matches whole strings (``re.fullmatch``); ``mode="search"`` is the
    unanchored JSON Schema meaning: each top-level alternative gets ``.*`` (any character,
    newline included) before and after unless it is anchored with ``^`` / ``$``.
    Raises RegexSyntaxError, UnsupportedFeatureError or GrammarBudgetError.
    """
    if flavor not in ("python", "ecma"):
        raise ValueError(f"unknown regex flavor {flavor!r}")
    if mode not in ("fullmatch", "search"):
        raise ValueError(f"unknown regex mode {mode!r}")
    return _Parser(pattern, flavor, mode, ignore_case, max_depth, max_repeat).parse()


class _Parser:
    def __init__(self, pattern: str, flavor: str, mode: str, ignore_case: bool, max_depth: int, max_repeat: int):
        self.p = pattern
        self.n = len(pattern)
        self.py = flavor == "python"
        self.mode = mode
        self.max_depth = max_depth
        self.max_repeat = max_repeat
        self.i = 0
        self.flags = _Flags(ignore_case=ignore_case)
        self.stack: list[_Frame] = [_Frame(0, self.flags)]
        self.groups = 1  # next capture index (re counts group 0)
        self.open_groups: set[int] = set()
        self.names: dict[str, int] = {}
        self.zero_width = False  # markers or lookaheads: the result goes through char_dfa

    # ------------------------------------------------------------------ errors and helpers

    def syntax(self, msg: str, pos: int) -> RegexSyntaxError:
        return RegexSyntaxError(msg, self.p, pos)

    def unsupported(self, what: str, pos: int) -> UnsupportedFeatureError:
        err = UnsupportedFeatureError(f"{what} is not supported (at position {pos} in {self.p!r})")
        err.pattern, err.position = self.p, pos  # same attributes as RegexSyntaxError
        return err

    def peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.p[j] if j < self.n else None

    def add(self, expr: Expr, pos: int, kind: str = "atom", anchor: str = "strict") -> None:
        self.stack[-1].items.append(_Item(expr, pos, kind, anchor))

    # ------------------------------------------------------------------ main loop

    def parse(self) -> Expr:
        steps = 0
        while self.i < self.n:
            steps += 1
            if steps & 4095 == 0:
                charge("parsing the regex", 4096)
            c = self.p[self.i]
            if self.py and self.flags.verbose and c in _VERBOSE_WS + "#":
                self.skip_verbose(c)
            elif c == "|":
                frame = self.stack[-1]
                frame.alts.append(frame.items)
                frame.items = []
                self.i += 1
            elif c == "(":
                self.open_group()
            elif c == ")":
                self.close_group()
            elif c in "*+?" or (c == "{" and self.quantifier_ahead()):
                self.quantifier()
            elif c == "[":
                self.add(self.char_class(), self.i)
            elif c == "\\":
                self.escape()
            elif c == ".":
                self.add(self.dot(), self.i)
                self.i += 1
            elif c in "^$":
                multiline = self.py and self.flags.multiline
                mode = "multiline" if multiline else ("dollar" if self.py and c == "$" else "strict")
                self.anchor("start" if c == "^" else "end", mode, self.i)
                self.i += 1
            else:
                self.plain_text()
        if len(self.stack) > 1:
            raise self.syntax("missing ), unterminated subpattern", self.stack[-1].pos)
        top = self.stack[0]
        expr = _alternation([self.finish_alternative(alt) for alt in top.alts + [top.items]])
        if self.zero_width:
            from . import char_dfa

            expr = char_dfa.to_ir(char_dfa.from_ir(expr))
        return expr

    def plain_text(self) -> None:
        """A run of ordinary characters as one literal (a 1 MB literal pattern would otherwise be a
        million items); a quantifier after the run binds to its last character only."""
        end = self.i + 1
        run = _PLAIN_RUN.match(self.p, self.i)
        if run is not None and not self.flags.ignore_case and not (self.py and self.flags.verbose):
            end = run.end()
            if end < self.n and self.p[end] in "*+?{":
                end -= 1
        if end - self.i < 2:
            self.add(self.char(ord(self.p[self.i])), self.i)
            self.i += 1
            return
        self.add(ir.literal(self.p[self.i : end]), self.i)
        self.i = end

    def skip_verbose(self, c: str) -> None:
        if c == "#":
            nl = self.p.find("\n", self.i)
            self.i = self.n if nl < 0 else nl + 1
        else:
            self.i += 1

    # ------------------------------------------------------------------ atoms

    def char(self, cp: int) -> Expr:
        if self.flags.ignore_case and cp < 128 and chr(cp) in _ASCII_LETTERS:
            return ir.char_class(ascii_fold(((cp, cp),)))
        if 0xD800 <= cp <= 0xDFFF:
            return ir.NOTHING  # a lone surrogate never occurs in valid UTF-8 text
        return ir.literal(chr(cp))

    def set_expr(self, ranges: Ranges, negate: bool = False) -> Expr:
        if self.flags.ignore_case:
            ranges = ascii_fold(ranges)
        expr = ir.char_class(ranges, negate=negate)
        if isinstance(expr, ir.CharClass) and len(expr.ranges) == 1 and expr.ranges[0][0] == expr.ranges[0][1]:
            return ir.literal(chr(expr.ranges[0][0]))  # [.] is the literal '.': lets literals merge
        return expr

    def dot(self) -> Expr:
        if not self.py:
            return ir.char_class(ECMA_LINE_TERMINATORS, negate=True)
        return ir.ANY_CHAR if self.flags.dotall else ir.char_class(((10, 10),), negate=True)

    def anchor(self, kind: str, mode: str, pos: int) -> None:
        if len(self.stack) > 1:
            if mode != "strict":
                name = self.p[pos : pos + (2 if self.p[pos] == "\\" else 1)]
                raise self.unsupported(f"anchor {name!r} inside a group (multiline or Python '$')", pos)
            self.zero_width = True
        self.add(_marker(kind), pos, kind, mode)

    # ------------------------------------------------------------------ groups

    def open_group(self) -> None:
        start = self.i
        if len(self.stack) > self.max_depth:
            raise GrammarBudgetError(
                f"regex nesting deeper than {self.max_depth} groups at position {start} (max_depth)"
            )
        self.i += 1
        flags = self.flags
        group: int | None = None
        if self.peek() == "?":
            self.i += 1
            ext = self.extension(start)
            if ext is None:
                return  # a comment or global flags: no group
            kind, value = ext
            if kind == "flags":
                flags = value
            elif kind == "named":
                group = self.new_group(value, start)
            elif kind == "lookahead":
                self.stack.append(_Frame(start, self.flags, None, lookahead=value))  # type: ignore[arg-type]
                return
        else:
            group = self.new_group(None, start)
        self.stack.append(_Frame(start, self.flags, group))
        self.flags = flags

    def new_group(self, name: str | None, pos: int) -> int:
        index = self.groups
        self.groups += 1
        self.open_groups.add(index)
        if name is not None:
            if name in self.names:
                raise self.syntax(f"redefinition of group name {name!r}", pos)
            self.names[name] = index
        return index

    def extension(self, start: int) -> tuple[str, object] | None:
        """Parse after ``(?``; returns ("plain"|"named"|"flags", value) or None (no group)."""
        c = self.peek()
        if c is None:
            raise self.syntax("unexpected end of pattern", self.i)
        if c == ":":
            self.i += 1
            return ("plain", None)
        if c in "=!":
            frame = self.stack[-1]
            if len(self.stack) > 1 or any(it.kind not in ("start", "lookahead") for it in frame.items):
                raise self.unsupported(f"lookahead '(?{c}' that is not at the start of the pattern", start)
            self.i += 1
            self.zero_width = True
            return ("lookahead", c)
        if c == "<" and self.peek(1) in ("=", "!"):
            raise self.unsupported(f"lookbehind '(?<{self.peek(1)}'", start)
        if self.py:
            return self.py_extension(c, start)
        if c == "<":
            self.i += 1
            return ("named", self.group_name(">", start))
        raise self.syntax(f"invalid group '(?{c}'", start)

    def py_extension(self, c: str, start: int) -> tuple[str, object] | None:
        if c == "P":
            self.i += 1
            nxt = self.peek()
            if nxt == "<":
                self.i += 1
                return ("named", self.group_name(">", start))
            if nxt == "=":
                self.i += 1
                name = self.group_name(")", start)
                if name not in self.names:
                    raise self.syntax(f"unknown group name {name!r}", start)
                raise self.unsupported(f"backreference '(?P={name})'", start)
            raise self.syntax(f"unknown extension ?P{nxt or ''}", start)
        if c == "#":
            end = self.p.find(")", self.i)
            if end < 0:
                raise self.syntax("missing ), unterminated comment", start)
            self.i = end + 1
            return None
        if c == "(":
            raise self.unsupported("conditional group '(?('", start)
        if c == ">":
            raise self.unsupported("atomic group '(?>'", start)
        if c in "aiLmsuxt-":
            return self.py_flags(start)
        raise self.syntax(f"unknown extension ?{c}", start)

    def group_name(self, terminator: str, start: int) -> str:
        end = self.p.find(terminator, self.i)
        if end < 0:
            raise self.syntax(f"missing {terminator}, unterminated name", self.i)
        name = self.p[self.i : end]
        if not name:
            raise self.syntax("missing group name", self.i)
        if not name.isidentifier() or (not self.py and not name.isascii()):
            raise self.syntax(f"bad character in group name {name!r}", self.i)
        self.i = end + 1
        return name

    def py_flags(self, start: int) -> tuple[str, object] | None:
        on, off, cur = "", "", "on"
        while True:
            c = self.peek()
            if c is None:
                raise self.syntax("missing -, : or )", self.i)
            self.i += 1
            if c == ")" and cur == "on" and not off:
                break
            if c == ":":
                break
            if c == "-" and cur == "on":
                cur = "off"
                continue
            if c in "Lut":
                raise self.unsupported(f"inline flag {c!r}", self.i - 1)
            if c not in "aimsx" or (cur == "off" and c == "a"):
                raise self.syntax("unknown flag" if c.isalpha() else "missing -, : or )", self.i - 1)
            on, off = (on + c, off) if cur == "on" else (on, off + c)
        if cur == "off" and not off:
            raise self.syntax("missing flag", self.i - 1)
        if set(on) & set(off):
            raise self.syntax("bad inline flags: flag turned on and off", self.i - 1)
        flags = _apply_flags(self.flags, on, off)
        if c == ")":  # global flags: only before the first item of the pattern
            frame = self.stack[-1]
            if len(self.stack) > 1 or frame.alts or frame.items:
                raise self.syntax("global flags not at the start of the expression", start)
            self.flags = flags
            return None
        return ("flags", flags)

    def close_group(self) -> None:
        if len(self.stack) == 1:
            raise self.syntax("unbalanced parenthesis", self.i)
        frame = self.stack.pop()
        self.i += 1
        self.flags = frame.outer_flags
        if frame.group is not None:
            self.open_groups.discard(frame.group)
        inner = _alternation([_join([it.expr for it in alt]) for alt in frame.alts + [frame.items]])
        if frame.lookahead is not None:
            self.add(inner, frame.pos, "lookahead", frame.lookahead)
        else:
            self.add(inner, frame.pos, "group")

    # ------------------------------------------------------------------ quantifiers

    def quantifier_ahead(self) -> bool:
        """Whether the ``{`` at ``self.i`` starts a valid quantifier (else it is a literal)."""
        return self.brace_bounds(self.i) is not None

    def brace_bounds(self, at: int) -> tuple[int, int | None, int] | None:
        j = at + 1
        k = j
        while k < self.n and self.p[k].isdigit() and self.p[k].isascii():
            k += 1
        lo_text = self.p[j:k]
        hi_text = lo_text
        comma = k < self.n and self.p[k] == ","
        if comma:
            m = k + 1
            while m < self.n and self.p[m].isdigit() and self.p[m].isascii():
                m += 1
            hi_text = self.p[k + 1 : m]
            k = m
        if k >= self.n or self.p[k] != "}":
            return None
        if not lo_text and (not self.py or not comma):
            return None  # '{}' (and in ECMA '{,n}') is literal text
        lo = int(lo_text) if lo_text else 0
        hi = int(hi_text) if hi_text else None
        return lo, hi, k + 1

    def quantifier(self) -> None:
        start = self.i
        c = self.p[start]
        if c == "{":
            lo, hi, self.i = self.brace_bounds(start)  # type: ignore[misc]
            for bound in (lo, hi):
                if bound is not None and bound > self.max_repeat:
                    raise GrammarBudgetError(
                        f"repetition count {bound} above max_repeat={self.max_repeat} at position {start}"
                    )
            if hi is not None and hi < lo:
                raise self.syntax("min repeat greater than max repeat", start + 1)
        else:
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            self.i += 1
        items = self.stack[-1].items
        if not items or items[-1].kind in ("start", "end"):
            raise self.syntax("nothing to repeat", start)
        if items[-1].kind == "lookahead":
            raise self.unsupported("a quantified lookahead", start)
        if items[-1].kind == "repeat":
            raise self.syntax("multiple repeat", start)
        if self.peek() == "?":
            self.i += 1  # lazy: same language
        elif self.peek() == "+" and self.py:
            raise self.unsupported(f"possessive quantifier {self.p[start:self.i + 1]!r}", start)
        last = items[-1]
        items[-1] = _Item(ir.repeat(last.expr, lo, hi), last.pos, "repeat")

    # ------------------------------------------------------------------ escapes

    def escape(self) -> None:
        """An escape outside a class: anchors, classes, backreferences or one character."""
        start = self.i
        if start + 1 >= self.n:
            raise self.syntax("bad escape (end of pattern)", start)
        c = self.p[start + 1]
        if c in "bB":
            raise self.unsupported(f"word boundary '\\{c}'", start)
        if self.py and c in "AZ":
            self.i += 2
            self.anchor("start" if c == "A" else "end", "strict", start)
            return
        if c.isdigit() and c != "0" and c.isascii():
            if self.backreference(start):
                return
        kind, value = self.escape_value(in_class=False)
        self.add(self.set_expr(*value) if kind == "set" else self.char(value), start)

    def backreference(self, start: int) -> bool:
        """``\\1``-style references (refused); False when Python reads the digits as octal."""
        if self.py:
            digits = self.p[start + 1 : start + 4]
            if len(digits) == 3 and all(d in _OCT for d in digits):
                return False
            j = start + 1 + (2 if len(digits) >= 2 and digits[1].isdigit() and digits[1].isascii() else 1)
            group = int(self.p[start + 1 : j])
            if group >= self.groups:
                raise self.syntax(f"invalid group reference {group}", start + 1)
            if group in self.open_groups:
                raise self.syntax("cannot refer to an open group", start)
        raise self.unsupported(f"backreference {self.p[start:start + 2]!r}...", start)

    def escape_value(self, in_class: bool) -> tuple[str, object]:
        """Parse ``\\X`` at ``self.i``: ("char", code point) or ("set", (ranges, negate))."""
        start = self.i
        if start + 1 >= self.n:
            raise self.syntax("bad escape (end of pattern)", start)
        c = self.p[start + 1]
        self.i += 2
        classes = PY_CLASSES if self.py else ECMA_CLASSES
        if c.lower() in classes:
            return "set", (classes[c.lower()], c.isupper())
        if in_class and c == "b":
            return "char", 8
        simple = _PY_ESCAPES if self.py else _ECMA_ESCAPES
        if c in simple:
            return "char", simple[c]
        if c == "x":
            return "char", self.hex_digits(2, start)
        if c == "u":
            if not self.py and self.peek() == "{":
                return "char", self.braced_code_point(start)
            return "char", self.utf16_pair(self.hex_digits(4, start), start)
        if self.py:
            return "char", self.py_escape_tail(c, start, in_class)
        if c in "pP":
            return "set", (self.unicode_property(start), c == "P")
        return "char", self.ecma_escape_tail(c, start, in_class)

    def py_escape_tail(self, c: str, start: int, in_class: bool) -> int:
        if c == "U":
            cp = self.hex_digits(8, start)
            if cp > ir.MAX_UNICODE:
                raise self.syntax(f"bad escape {self.p[start:self.i]}", start)
            return cp
        if c == "N":
            if self.peek() != "{":
                raise self.syntax("missing {", self.i)
            end = self.p.find("}", self.i)
            name = self.p[self.i + 1 : end] if end > 0 else ""
            if end < 0 or not name:
                raise self.syntax("missing character name", self.i)
            try:
                cp = ord(unicodedata.lookup(name))
            except KeyError:
                raise self.syntax(f"undefined character name {name!r}", start) from None
            self.i = end + 1
            return cp
        if c in _OCT and (c == "0" or in_class):
            digits = c
            while len(digits) < 3 and self.peek() is not None and self.peek() in _OCT:
                digits += self.p[self.i]
                self.i += 1
            if int(digits, 8) > 0o377:
                raise self.syntax(f"octal escape value \\{digits} outside of range 0-0o377", start)
            return int(digits, 8)
        if c in _ASCII_LETTERS or c in "89":
            raise self.syntax(f"bad escape \\{c}", start)
        if c in "1234567":  # outside a class, three octal digits (checked by backreference())
            self.i += 2
            value = int(self.p[start + 1 : self.i], 8)
            if value > 0o377:
                raise self.syntax(f"octal escape value {self.p[start:self.i]} outside of range 0-0o377", start)
            return value
        return ord(c)

    def ecma_escape_tail(self, c: str, start: int, in_class: bool) -> int:
        if c == "0" and not (self.peek() or "").isdigit():
            return 0
        if c == "c":
            letter = self.peek()
            if letter is None or letter not in _ASCII_LETTERS:
                raise self.syntax("bad control escape \\c", start)
            self.i += 1
            return ord(letter) % 32
        if c == "k":
            raise self.unsupported("backreference '\\k'", start)
        if c.isalnum() and c.isascii():
            raise self.syntax(f"bad escape \\{c}", start)
        return ord(c)  # identity escape of a syntax character

    def unicode_property(self, start: int) -> Ranges:
        """``\\p{...}`` after ``\\p``: a General_Category value or Any / ASCII / Assigned."""
        end = self.p.find("}", self.i)
        if self.peek() != "{" or end < 0:
            raise self.syntax("missing {...} after \\p", start)
        text = self.p[self.i + 1 : end]
        self.i = end + 1
        key, _, value = text.rpartition("=")
        if key not in ("", "gc", "General_Category"):
            raise self.unsupported(f"Unicode property {text!r}", start)
        ranges = unicode_property(value, general_only=bool(key))
        if ranges is None:
            raise self.unsupported(f"Unicode property {text!r}", start)
        return ranges

    def hex_digits(self, count: int, start: int) -> int:
        text = self.p[self.i : self.i + count]
        if len(text) != count or any(h not in _HEX for h in text):
            raise self.syntax(f"incomplete escape {self.p[start:self.i + count]}", start)
        self.i += count
        return int(text, 16)

    def braced_code_point(self, start: int) -> int:
        end = self.p.find("}", self.i)
        text = self.p[self.i + 1 : end] if end > 0 else ""
        if not text or any(h not in _HEX for h in text) or int(text, 16) > ir.MAX_UNICODE:
            raise self.syntax("bad \\u{...} escape", start)
        self.i = end + 1
        return int(text, 16)

    def utf16_pair(self, cp: int, start: int) -> int:
        """ECMA writes astral characters as surrogate pairs ``\\uD83D\\uDE00``: join them."""
        if self.py or not 0xD800 <= cp <= 0xDBFF or self.p[self.i : self.i + 2] != "\\u":
            return cp
        text = self.p[self.i + 2 : self.i + 6]
        if len(text) == 4 and all(h in _HEX for h in text) and 0xDC00 <= int(text, 16) <= 0xDFFF:
            self.i += 6
            return 0x10000 + ((cp - 0xD800) << 10) + (int(text, 16) - 0xDC00)
        return cp

    # ------------------------------------------------------------------ character classes

    def class_atom(self) -> tuple[str, object]:
        c = self.p[self.i]
        if c == "\\":
            return self.escape_value(in_class=True)
        self.i += 1
        return "char", ord(c)

    def char_class(self) -> Expr:
        start = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        count = 0
        while True:
            c = self.peek()
            if c is None:
                raise self.syntax("unterminated character set", start)
            if c == "]" and (count or not self.py):
                self.i += 1
                break
            atom_pos = self.i
            kind, value = self.class_atom()
            count += 1
            if self.peek() == "-" and self.peek(1) not in (None, "]"):
                self.i += 1
                kind2, value2 = self.class_atom()
                if (kind != "char" or kind2 != "char") and not self.py:
                    # ECMA Annex B: [\w-.] is \w, '-' and '.' (Python's re refuses it)
                    ranges.append((0x2D, 0x2D))
                    for k, v in ((kind, value), (kind2, value2)):
                        ranges.extend(_atom_ranges(k, v))
                    continue
                if kind != "char" or kind2 != "char":
                    raise self.syntax(f"bad character range {self.p[atom_pos:self.i]}", atom_pos)
                if value2 < value:  # type: ignore[operator]
                    raise self.syntax(f"bad character range {self.p[atom_pos:self.i]}", atom_pos)
                ranges.append((value, value2))  # type: ignore[arg-type]
            else:
                ranges.extend(_atom_ranges(kind, value))
        return self.set_expr(tuple(ranges), negate)

    # ------------------------------------------------------------------ anchors and search mode

    def finish_alternative(self, items: list[_Item]) -> Expr:
        """Strip leading/trailing anchors of a top-level alternative; add search-mode padding.

        Anchors are zero-width conditions on one position: leading ones constrain the text
        before the match, trailing ones the text after it (an anchors-only alternative: both).
        """
        looks = [it for it in items if it.kind == "lookahead"]
        items = [it for it in items if it.kind != "lookahead"]
        if all(it.kind in ("start", "end") for it in items):
            lead = trail = len(items)
            before, after = items, items
        else:
            lead = 0
            while items[lead].kind == "start":
                lead += 1
            trail = len(items)
            while items[trail - 1].kind == "end":
                trail -= 1
            before, after = items[:lead], items[trail:]
        for it in items[lead:trail]:
            if it.kind in ("start", "end"):
                if it.anchor != "strict":
                    name = self.p[it.pos : it.pos + (2 if self.p[it.pos] == "\\" else 1)]
                    raise self.unsupported(f"anchor {name!r} that is not at an end of the pattern (multiline or Python '$')", it.pos)
                self.zero_width = True
        body = _join([it.expr for it in items[lead:trail]])
        prefix, suffix = (ir.EMPTY, ir.EMPTY) if self.mode == "fullmatch" else (_prefix(before), _suffix(after))
        if looks:
            return self.lookaheads(looks, ir.seq(body, suffix), prefix)
        return ir.seq(prefix, body, suffix)

    def lookaheads(self, looks: list[_Item], rest: Expr, prefix: Expr) -> Expr:
        """``prefix`` then the text from the lookahead position on: ``rest`` intersected with
        ``X.*`` for each ``(?=X)``, minus it for each ``(?!X)``."""
        from . import char_dfa

        if prefix != ir.EMPTY and any(_has(e, char_dfa.START) for e in [rest, *(it.expr for it in looks)]):
            raise self.unsupported("'^' inside an unanchored lookahead pattern", looks[0].pos)
        dfa = char_dfa.from_ir(rest)
        for it in looks:
            ahead = char_dfa.from_ir(ir.seq(it.expr, _ANY_STAR))
            dfa = char_dfa.intersect(dfa, ahead) if it.anchor == "=" else char_dfa.difference(dfa, ahead)
        return ir.seq(prefix, char_dfa.to_ir(dfa))


def _marker(kind: str) -> Expr:
    """The zero-width marker of a strict anchor (see ``char_dfa``); ends of a top-level
    alternative are stripped before use, so only inner anchors reach the automaton."""
    from . import char_dfa

    return char_dfa.START if kind == "start" else char_dfa.END


def _has(expr: Expr, part: Expr) -> bool:
    stack = [expr]
    while stack:
        e = stack.pop()
        if e == part:
            return True
        if isinstance(e, (ir.Seq, ir.Choice)):
            stack.extend(e.items)
        elif isinstance(e, ir.Repeat):
            stack.append(e.item)
        elif isinstance(e, ir.Graph):
            stack.extend(x for _, x, _ in e.edges)
    return False


def _atom_ranges(kind: str, value: object) -> Ranges:
    """The ranges of one class atom: ("char", code point) or ("set", (ranges, negated))."""
    if kind == "char":
        return ((value, value),)  # type: ignore[return-value]
    ranges, negated = value  # type: ignore[misc]
    return ir.invert_ranges(ranges) if negated else ranges


def _prefix(anchors: list[_Item]) -> Expr:
    """What search mode allows before a match that starts at ``anchors``' position."""
    modes = {a.anchor for a in anchors if a.kind == "start"}
    if not modes:
        return _ANY_STAR
    if "strict" in modes:
        return ir.EMPTY
    return ir.optional(ir.seq(_ANY_STAR, ir.literal("\n")))  # ^ under m: start or after a newline


def _suffix(anchors: list[_Item]) -> Expr:
    """What search mode allows after a match that ends at ``anchors``' position."""
    modes = {a.anchor for a in anchors if a.kind == "end"}
    if not modes:
        return _ANY_STAR
    if "strict" in modes:
        return ir.EMPTY
    if "dollar" in modes:
        return ir.optional(ir.literal("\n"))  # Python's $ also matches before a final newline
    return ir.optional(ir.seq(ir.literal("\n"), _ANY_STAR))  # $ under m: end or before a newline


def _join(exprs: list[Expr]) -> Expr:
    """``ir.seq`` with runs of literals joined once (ir.seq appends pairwise: quadratic on long text)."""
    out: list[Expr] = []
    run: list[bytes] = []
    for e in exprs:
        if isinstance(e, ir.Literal):
            run.append(e.data)
            continue
        if run:
            out.append(ir.Literal(b"".join(run)))
            run = []
        out.append(e)
    if run:
        out.append(ir.Literal(b"".join(run)))
    return ir.seq(*out)


def _alternation(alts: list[Expr]) -> Expr:
    """``ir.choice``, except that alternatives of single characters become one class (a|b|[cd])."""
    ranges: list[tuple[int, int]] = []
    for e in alts:
        if isinstance(e, ir.CharClass):
            ranges.extend(e.ranges)
        elif isinstance(e, ir.Literal) and len(text := e.data.decode("utf-8")) == 1:
            ranges.append((ord(text), ord(text)))
        else:
            return trie_choice(*alts)
    return ir.char_class(ranges) if len(alts) > 1 else alts[0]


def _apply_flags(flags: _Flags, on: str, off: str) -> _Flags:
    names = {"i": "ignore_case", "s": "dotall", "m": "multiline", "x": "verbose"}
    changes = {names[f]: True for f in on if f in names}
    changes.update({names[f]: False for f in off if f in names})
    return replace(flags, **changes)
