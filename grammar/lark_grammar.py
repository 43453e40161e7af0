"""Lark grammar text -> grammar IR, parsed with the ``lark`` package itself.

``lark.load_grammar`` resolves imports (``%import common.NUMBER`` works: lark ships common.lark),
templates, aliases and the EBNF operators, and compiles the grammar into plain BNF rules over
terminals; terminals become single regexes (``PatternRE``) or strings (``PatternStr``).
Each terminal becomes an IR rule (regexes through ``regex_to_ir(flavor="python")``), each Lark rule
a choice over its expansions.

Semantics are *scannerless*: a terminal matches any string of its language wherever the grammar
allows it, as Lark's Earley parser with ``lexer="dynamic_complete"`` does. Lexer-only effects
(terminal priorities, longest match, keywords beating names in a contextual lexer) are not
modelled, so the automaton may accept a few strings that a lexer-based Lark parser would reject.

Regex terminals go through formcast's regex front end, whose ``\\w \\d \\s \\b`` are ASCII (``re.ASCII``),
whereas Lark runs Python's ``re`` on ``str`` (Unicode classes): ``/\\w+/`` here does not match ``é``.
That is narrower than Lark, never wider; write explicit ranges for non-ASCII letters.

``%ignore`` terminals are inserted as an optional repetition (``IGNORED*``) between every two
symbols of every expansion and around the start rule: exactly the places where a lexer could
skip them between two tokens.

Left recursion (``sum: sum "+" product | product``, common in Lark grammars), direct or indirect,
is rewritten into iteration; left recursion through a nullable prefix is refused.
"""

from __future__ import annotations

from . import ir
from .ebnf import finish_grammar
from .errors import GrammarBudgetError, GrammarSyntaxError, UnsupportedFeatureError

IGNORE_RULE = "__formcast_ignore"
_TERMINAL_PREFIX = "__T_"  # Lark rule names are lowercase, terminals uppercase: keep them apart anyway


def _load(text: str, start: str):
    """Run Lark's own grammar loader; translate its errors to GrammarSyntaxError."""
    import lark
    from lark.load_grammar import load_grammar

    try:
        loaded, _ = load_grammar(text, "<grammar>", [], False)
        return loaded.compile([start], set())
    except lark.exceptions.UnexpectedInput as exc:
        raise GrammarSyntaxError(f"Lark grammar syntax error: {str(exc).strip().splitlines()[0]}",
                                 getattr(exc, "line", None), getattr(exc, "column", None)) from None
    except (lark.exceptions.GrammarError, lark.exceptions.LarkError, KeyError) as exc:
        line, column = _position_of(str(exc))
        raise GrammarSyntaxError(f"Lark grammar error: {str(exc).strip().splitlines()[0]}", line, column) from None
    except RecursionError:  # Lark's loader recurses once per nested group
        raise GrammarBudgetError("Lark grammar nests its groups deeper than Lark's grammar loader can read (Python's recursion limit)") from None


def _position_of(message: str) -> tuple[int | None, int | None]:
    """Lark's GrammarError messages carry positions as 'line N' / 'column M' in free text."""
    import re

    line = re.search(r"[Ll]ine:? (\d+)", message)
    col = re.search(r"[Cc]olumn:? (\d+)", message)
    return (int(line.group(1)) if line else None, int(col.group(1)) if col else None)


def _terminal_expr(term) -> ir.Expr:
    from lark.lexer import PatternStr

    pattern = term.pattern
    flags = set(pattern.flags) - {"u"}  # Unicode matching is the default anyway
    unsupported = flags - {"i", "s", "x", "m"}
    if unsupported:
        raise UnsupportedFeatureError(
            f"Lark terminal {term.name!r} uses regex flags {sorted(unsupported)}; only i, s, x, m are supported"
        )
    if isinstance(pattern, PatternStr) and not flags:
        return ir.literal(pattern.value)
    from .regex import regex_to_ir

    source = pattern.value if not isinstance(pattern, PatternStr) else pattern.to_regexp()
    scoped = "".join(sorted(flags - {"i"}))
    if scoped:  # the regex front end enforces (or refuses) scoped flags itself
        source = f"(?{scoped}:{source})"
    return regex_to_ir(source, flavor="python", mode="fullmatch", ignore_case="i" in flags)


def lark_to_grammar(text: str, *, start: str = "start") -> ir.Grammar:
    """Lower a Lark grammar (``start`` is the start rule) to the IR.

    Raises GrammarSyntaxError for grammars Lark itself rejects, undefined symbols, an empty
    language or indirect left recursion; UnsupportedFeatureError for regex terminals formcast
    cannot enforce exactly (lookaround, backreferences, flags other than ``i``).
    """
    terminals, rules, ignore = _load(text, start)
    term_names = {t.name for t in terminals}
    for name in ignore:
        if name not in term_names:
            raise GrammarSyntaxError(f"%ignore names undefined terminal {name!r}")

    def symbol(sym) -> ir.Expr:
        return ir.Ref(_TERMINAL_PREFIX + str(sym.name) if sym.is_term else str(sym.name))

    def gap() -> list[ir.Expr]:
        return [ir.Ref(IGNORE_RULE)] if ignore else []

    alternatives: dict[str, list[ir.Expr]] = {}
    for rule in rules:
        items: list[ir.Expr] = []
        for i, sym in enumerate(rule.expansion):
            if i:
                items.extend(gap())
            items.append(symbol(sym))
        alternatives.setdefault(str(rule.origin.name), []).append(ir.seq(*items))

    out: dict[str, ir.Expr] = {name: ir.choice(*alts) for name, alts in alternatives.items()}
    for term in terminals:
        out[_TERMINAL_PREFIX + str(term.name)] = _terminal_expr(term)
    if start not in out:
        raise GrammarSyntaxError(f"start rule {start!r} is not defined")
    root = start
    if ignore:
        out[IGNORE_RULE] = ir.star(ir.choice(*(ir.Ref(_TERMINAL_PREFIX + n) for n in ignore)))
        root = "__formcast_start"
        out[root] = ir.seq(ir.Ref(IGNORE_RULE), ir.Ref(start), ir.Ref(IGNORE_RULE))
    for name, body in out.items():
        for ref in ir.iter_refs(body):
            if ref not in out:
                raise GrammarSyntaxError(f"rule {name!r} uses undefined symbol {ref!r}")
    return finish_grammar(ir.Grammar(out, root=root, source_kind="lark"))
