"""Whitespace and separators between JSON tokens: flexible (bounded), compact, or indented.

Flexible whitespace allows at most ``max_whitespace`` characters between two tokens, so a model
cannot loop on newlines forever, while still accepting ``json.dumps`` output (``", "`` and
``": "``) and modest pretty-printing. Indent mode emits exactly what ``json.dumps(indent=n)``
writes, which needs the nesting depth: containers are built per depth.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import SchemaError

DEFAULT_MAX_WHITESPACE = 20
MAX_INDENT_DEPTH = 32  # indent mode: deeper nesting is not generated (documented restriction)
_WS_CHARS = [(0x20, 0x20), (0x09, 0x0A), (0x0D, 0x0D)]


@dataclass(frozen=True)
class Layout:
    mode: str  # "flexible" | "compact" | "indent"
    max_whitespace: int = DEFAULT_MAX_WHITESPACE
    indent: int = 0

    @staticmethod
    def from_option(whitespace: str | int, max_whitespace: int | None) -> "Layout":
        mw = DEFAULT_MAX_WHITESPACE if max_whitespace is None else int(max_whitespace)
        if mw < 0 or mw > 256:
            raise SchemaError(f"max_whitespace must be within 0..256, got {mw}")
        if isinstance(whitespace, bool) or not isinstance(whitespace, (str, int)):
            raise SchemaError(f"whitespace must be 'flexible', 'compact' or an indent width, got {whitespace!r}")
        if isinstance(whitespace, int):
            if not 0 <= whitespace <= 16:
                raise SchemaError(f"indent width must be within 0..16, got {whitespace}")
            return Layout("indent", mw, whitespace)
        if whitespace not in ("flexible", "compact"):
            raise SchemaError(f"whitespace must be 'flexible', 'compact' or an indent width, got {whitespace!r}")
        return Layout(whitespace, mw)

    @property
    def depth_sensitive(self) -> bool:
        return self.mode == "indent"

    def ws(self) -> ir.Expr:
        if self.mode != "flexible":
            return ir.EMPTY
        return ir.repeat(ir.char_class(_WS_CHARS), 0, self.max_whitespace)

    def _newline(self, depth: int) -> ir.Expr:
        return ir.literal("\n" + " " * (self.indent * depth))

    def open(self, ch: str, depth: int) -> ir.Expr:
        if self.mode == "indent":
            return ir.seq(ir.literal(ch), self._newline(depth + 1))
        return ir.seq(ir.literal(ch), self.ws())

    def close(self, ch: str, depth: int) -> ir.Expr:
        if self.mode == "indent":
            return ir.seq(self._newline(depth), ir.literal(ch))
        return ir.seq(self.ws(), ir.literal(ch))

    def sep(self, depth: int) -> ir.Expr:
        if self.mode == "indent":
            return ir.seq(ir.literal(","), self._newline(depth + 1))
        return ir.seq(self.ws(), ir.literal(","), self.ws())

    def colon(self) -> ir.Expr:
        if self.mode == "indent":
            return ir.literal(": ")
        return ir.seq(self.ws(), ir.literal(":"), self.ws())

    def empty(self, pair: str) -> ir.Expr:
        if self.mode == "flexible":
            return ir.seq(ir.literal(pair[0]), self.ws(), ir.literal(pair[1]))
        return ir.literal(pair)

    def outer(self) -> ir.Expr:
        return self.ws()
