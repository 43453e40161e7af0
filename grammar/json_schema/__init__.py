"""JSON Schema (2020-12, plus draft-07 / 2019-09 spellings) -> grammar IR.

Public entry point: :func:`json_schema_to_grammar`. Submodules, one concept each:
``refs`` (loading, metaschema check, ``$ref`` normalization), ``merge`` (``allOf``),
``lower`` (the walker and combinators), ``objects``, ``scalars`` (strings and numbers),
``strings`` (JSON string encoding of character-level constraints), ``numbers`` (digit
automata), ``formats`` and ``layout`` (whitespace).

Decisions worth knowing (measured on MaskBench dev samples, byte-level walk of
``json.dumps(data, ensure_ascii=False)``; the ratchet sample is tests/data/maskbench_json_schema.json):
- Zero invalidations measured (an invalid instance accepted) on ~450 sampled schemas; about 82-93%
  of schemas pass fully (sample-dependent), ~1.5% "validation errors" (valid instance rejected),
  the rest refused or over the automaton budget.
- Properties are emitted in ``properties`` order (then ``required`` names not in
  ``properties``); extra keys may sit in any gap. An instance whose keys come in another order is
  rejected: a restriction of the output language, never an acceptance of invalid output. This is
  the main source of the validation errors above (schemas with alphabetized ``properties``).
- Numbers: the exact JSON grammar. Integers accept ``5``, ``5.0`` and, when unbounded, ``5e+3``;
  bounded numbers and ``multipleOf: 0.01``-style steps are exact but exponent-free (``1e2`` for
  ``maximum: 100`` is rejected, a restriction).
- Strings: every JSON spelling of each character (raw UTF-8, short escapes, ``\\uXXXX`` in
  either case, surrogate pairs); lengths count characters. ``maxLength`` next to a ``pattern`` or
  ``format`` is exact when one repeat carries the slack, else refused.
- ``format``: the standard formats listed in ``formats`` are enforced; other standard ones are
  refused; non-standard names are annotations (validators ignore them too).
- ``nullable`` (OpenAPI) is not JSON Schema: ignored, like jsonschema does.
- ``oneOf``: a choice when branches are provably disjoint (types, const/enum, required vs
  forbidden keys), or rewritten as "this branch and not the others" when each branch's negation is
  expressible; else refused.
- A keyword that is not enforced exactly raises UnsupportedFeatureError naming it and its JSON
  pointer, unless listed in ``relax_keywords`` (then it is ignored). Annotations
  (``title``, ``description``, ``default``, ``examples``...) and unknown keywords are ignored,
  as the specification says.
- Indent mode builds containers per depth and stops at depth 32; recursion and reference
  bombs meet MAX_WORK / MAX_NESTING / MAX_BRANCHES (GrammarBudgetError).
"""

from __future__ import annotations

import sys
from typing import Iterable

from .. import ir
from ..errors import GrammarBudgetError, SchemaError
from .layout import Layout
from .lower import Lowerer
from .refs import Dynamic, load_schema, normalize_refs
from .unique_check import build_check

__all__ = ["json_schema_to_grammar"]


def json_schema_to_grammar(
    schema: dict | str | bool,
    *,
    whitespace: str | int = "flexible",
    strict_properties: bool = False,
    max_whitespace: int | None = None,
    relax_keywords: Iterable[str] = (),
) -> ir.Grammar:
    """Lower a JSON Schema to a grammar accepting exactly the JSON texts valid against it.

    ``whitespace``: ``"flexible"`` (at most ``max_whitespace`` whitespace characters between
    tokens, default 20), ``"compact"`` (none) or an int indent width (``json.dumps(indent=n)``
    layout). ``strict_properties``: absent ``additionalProperties`` means ``false`` (OpenAI
    strict style) instead of the specification's ``true``. ``relax_keywords``: keywords to
    ignore where they cannot be enforced exactly. Raises SchemaError (invalid or unsatisfiable
    schema), UnsupportedFeatureError, GrammarBudgetError.
    """
    layout = Layout.from_option(whitespace, max_whitespace)
    raw, validator_cls = load_schema(schema)
    dynamic = Dynamic()
    doc = normalize_refs(raw, dynamic)
    lowerer = Lowerer(doc, validator_cls, layout, strict_properties, relax_keywords, dynamic)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # the walker recurses once per nested subschema
    try:
        root = lowerer.den.sub("")
        body = lowerer.value(root, 0)
        check = build_check(lowerer.den, root) if lowerer.has_unique else None
    finally:
        sys.setrecursionlimit(limit)
    if isinstance(body, ir.Nothing):
        if lowerer.approximated:
            raise GrammarBudgetError("schema expands to too many alternatives: the subset kept within budget is empty")
        raise SchemaError("schema is unsatisfiable: no JSON value is valid against it")
    # No whitespace after the document: nothing ever needs it, and a model that pads before EOS
    # only wastes its budget (leading whitespace stays allowed, as some models start with a newline).
    rules: dict[str, ir.Expr] = {"root": ir.seq(layout.outer(), body)}
    rules.update(lowerer.rules)
    grammar = ir.Grammar(rules, "root", "json_schema", check)
    grammar.validate()
    return grammar
