"""JSON Schema (2020-12, plus draft-07 / 2019-09 spellings) -> grammar IR.

Public entry point: :func:`json_schema_to_grammar`. Submodules, one concept each:
``refs`` (loading, metaschema check, ``$ref`` normalization), ``merge`` (``allOf``),
``lower`` (the walker and combinators), ``objects``, ``scalars`` (strings and numbers),
``strings`` (JSON string encoding of character-level constraints), ``numbers`` (digit
automata), ``formats`` and ``layout`` (whitespace).

Decisions worth knowing (measured against MaskBench in tests/data/maskbench_json_schema.json):
- Properties are emitted in ``properties`` order (then ``required`` names not in
  ``properties``); extra keys may sit in any gap. An instance whose keys come in another order is
  rejected: a restriction of the output language, never an acceptance of invalid output.
- Bounded non-integer numbers and ``multipleOf: 0.01``-style steps are exact but exponent-free.
- A keyword that is not enforced exactly raises UnsupportedFeatureError naming it and its JSON
  pointer, unless listed in ``relax_keywords`` (then it is ignored). Annotations
  (``title``, ``description``, ``default``, ``examples``...) and unknown keywords are ignored,
  as the specification says.
"""

from __future__ import annotations

import sys
from typing import Iterable

from .. import ir
from ..errors import SchemaError
from .layout import Layout
from .lower import Lowerer
from .refs import load_schema, normalize_refs

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
    doc = normalize_refs(raw)
    lowerer = Lowerer(doc, validator_cls, layout, strict_properties, relax_keywords)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))  # the walker recurses once per nested subschema
    try:
        body = lowerer.value(doc, "", 0)
    finally:
        sys.setrecursionlimit(limit)
    if isinstance(body, ir.Nothing):
        raise SchemaError("schema is unsatisfiable: no JSON value is valid against it")
    rules: dict[str, ir.Expr] = {"root": ir.seq(layout.outer(), body, layout.outer())}
    rules.update(lowerer.rules)
    grammar = ir.Grammar(rules, "root", "json_schema")
    grammar.validate()
    return grammar
