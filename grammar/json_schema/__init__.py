"""JSON Schema (draft-04, -06, -07, 2019-09, 2020-12) -> grammar IR.

Public entry point: :func:`json_schema_to_grammar`. The data flow, one module per step:

    drafts     which draft applies ($schema, else the ``draft`` option) and what its rules change
    refs       load, metaschema check (ECMA regexes), $ref / $dynamicRef / $recursiveRef normalization
    schema_denoter  schema objects -> denotations (every keyword, combinators included)
      keywords   the local keywords of one schema object (type, enum/const, each type's own)
    denotation_algebra  the denotation algebra: intersection, union, complement, oneOf, a and not b
      exprs      lazy subschema expressions (Ptr / Const / And / Or / Not) inside conjunctions
      numsets    number sets (intervals, multiples, non-multiples, excluded points)
      strsets    string sets (symbolic, folded into char_dfa automata when needed)
      conjs      array and object conjunctions, their intersection and one-atom negations
      membership exact membership of a value in a denotation
    lower      denotations -> IR (memoized per expression and per denotation; cycles -> rules)
      objects, arrays, strings, numbers, formats, regex_format, layout
    unique     uniqueItems: small domains as automata, the rest as a matcher check:
      unique_check   the incremental JSON scanner that marks duplicate items for the automaton
      unique_tokens  its per-vocabulary token indexes
      unique_values  JSON value equality (numbers as decimals and floats, objects unordered)

Decisions worth knowing (MaskBench dev samples, byte-level walk of
``json.dumps(data, ensure_ascii=False)``; the ratchet is tests/data/maskbench_json_schema.json):
- Exact or refused. ``allOf`` intersects, ``anyOf`` unites, ``not`` complements, ``oneOf`` is
  "this branch and none of the others", ``if``/``then``/``else`` is (if and then) or (not if and
  else): all exact (``denotation_algebra``). ``unevaluatedProperties`` / ``unevaluatedItems`` are static
  (``schema_denoter``); ``$dynamicRef`` resolves per dynamic scope. ``uniqueItems`` is exact: an
  automaton of used values for small item domains, otherwise a check in the matcher
  (``unique_check``) that writes a mark after each duplicate item, which only the branches
  allowing duplicates accept: the check binds the branch and the array it was compiled for.
  It is the only keyword enforced outside the automaton. What cannot be complemented exactly (a
  negated ``uniqueItems`` or ``format``, a union cut to a subset under budget) is refused where
  a complement is needed.
- Drafts (``drafts``): ``$schema`` or the ``draft`` option selects a draft's own keywords and
  rules (``$ref`` overriding its siblings up to draft-07, ``id``, ``$recursiveRef``); without
  either, the 2020-12 rules apply, with the older spellings read where they cannot clash.
- Properties are emitted in ``properties`` order (then ``required`` names not in
  ``properties``); extra keys may sit in any gap. An instance whose keys come in another order is
  rejected: a restriction of the output language, never an acceptance of invalid output.
- Numbers: the exact JSON grammar. Integers accept ``5``, ``5.0`` and, when unbounded, ``5e+3``;
  bounded or otherwise constrained numbers are exact but exponent-free (``1e2`` for
  ``maximum: 100`` is rejected, a restriction). ``multipleOf`` of any step is exact through a
  residue automaton (refused past 5,000 residues).
- Strings: every JSON spelling of each character (raw UTF-8, short escapes, ``\\uXXXX`` in
  either case, surrogate pairs); lengths count characters. Several patterns, formats and length
  bounds intersect exactly through ``char_dfa`` (refused past its state budget).
- ``format``: every 2020-12 format is enforced, several as safe subsets (``formats``); an unknown
  name is an annotation (validators ignore it too). ``formats="annotate"`` ignores ``format``
  altogether (the specification's default for validators). ``pattern`` follows ECMA-262; where Python's
  ``re`` (jsonschema) reads it differently, its complement is taken only over the characters on
  which both agree.
- Unions past ``denotation_algebra.MAX_BRANCHES`` keep their simplest members (a marked subset, never
  complemented); lowering counts its steps against the compile budget (``budget``); reference
  bombs meet MAX_WORK / MAX_NESTING.
- ``nullable`` (OpenAPI) is not JSON Schema: ignored, like jsonschema does. Without a named
  draft, ``$ref`` siblings apply (as in 2020-12, stricter than draft-07's "siblings ignored").
- A keyword that is not enforced exactly raises UnsupportedFeatureError naming it and its JSON
  pointer, unless listed in ``relax_keywords`` (then it is ignored). Annotations
  (``title``, ``description``, ``default``, ``examples``...) and unknown keywords are ignored,
  as the specification says.
- Indent mode builds containers per depth and stops at depth 32.
"""


from __future__ import annotations

from contextlib import nullcontext
from typing import Iterable

from .. import ir
from ..budget import compile_scope, in_compile_scope, recursion_room
from ..errors import GrammarBudgetError, SchemaError
from .drafts import check_formats, draft_named
from .layout import Layout
from .lower import MARK_RULE, Lowerer
from .objects import check_property_order
from .refs import Dynamic, load_schema, normalize_refs
from .unique import build_check
from .unique_check import MARK

__all__ = ["json_schema_to_grammar"]


def json_schema_to_grammar(
    schema: dict | str | bool,
    *,
    whitespace: str | int = "flexible",
    strict_properties: bool = False,
    max_whitespace: int | None = None,
    relax_keywords: Iterable[str] = (),
    draft: str | None = None,
    formats: str = "assert",
    property_order: str = "declared",
) -> ir.Grammar:
    """Lower a JSON Schema to a grammar accepting exactly the JSON texts valid against it.

    ``whitespace``: ``"flexible"`` (at most ``max_whitespace`` whitespace characters between
    tokens, default 20), ``"compact"`` (none) or an int indent width (``json.dumps(indent=n)``
    layout). ``strict_properties``: absent ``additionalProperties`` means ``false`` (OpenAI
    strict style) instead of the specification's ``true``. ``relax_keywords``: keywords to
    ignore where they cannot be enforced exactly. ``draft``: the draft of a schema without
    ``$schema`` (``"draft-04"``, ``"draft-06"``, ``"draft-07"``, ``"2019-09"``, ``"2020-12"``;
    None keeps formcast's default, see ``drafts``). ``formats``: ``"assert"`` (enforce ``format``)
    or ``"annotate"`` (ignore it, the specification's default for validators). ``property_order``:
    ``"declared"`` (named properties in the schema's order, what generation wants) or ``"any"``
    (every order of the named properties, as a validator reads the schema, for objects with at
    most ``objects.MAX_ANY_ORDER_KEYS`` named keys; larger objects keep the declared order). Raises
    SchemaError (invalid or unsatisfiable schema, bad option), UnsupportedFeatureError,
    GrammarBudgetError.
    """
    layout = Layout.from_option(whitespace, max_whitespace)
    annotate = check_formats(formats) == "annotate"
    any_order = check_property_order(property_order) == "any"
    draft_named(draft)  # a bad option is an error even where the schema names its draft
    # The metaschema check and the walker recurse a few frames per nested subschema; the
    # document's depth budget (checked first thing in load_schema) bounds how many.
    # Called on its own (not through api.compile_json_schema), it counts under the default budget.
    with recursion_room(20_000), (nullcontext() if in_compile_scope() else compile_scope()):
        raw, validator_cls, named = load_schema(schema, draft)
        dynamic = Dynamic()
        doc = normalize_refs(raw, dynamic, named)
        lowerer = Lowerer(doc, validator_cls, layout, strict_properties, relax_keywords, dynamic, named, annotate, any_order)
        root = lowerer.den.sub("")
        body = lowerer.value(root, 0)
        check = build_check(lowerer.den, root) if lowerer.has_unique else None
    if isinstance(body, ir.Nothing):
        if lowerer.approximated:
            raise GrammarBudgetError("schema expands to too many alternatives: the subset kept within budget is empty")
        raise SchemaError("schema is unsatisfiable: no JSON value is valid against it")
    # No whitespace after the document: nothing ever needs it, and a model that pads before EOS
    # only wastes its budget (leading whitespace stays allowed, as some models start with a newline).
    rules: dict[str, ir.Expr] = {"root": ir.seq(layout.outer(), body)}
    rules.update(lowerer.rules)
    if lowerer.marks:
        # Without a check nothing writes the mark: its rule matches nothing.
        rules[MARK_RULE] = ir.Literal(bytes([MARK])) if check is not None else ir.NOTHING
    # References are checked once, where every grammar is compiled (RuleGraph.of): a second
    # walk of the whole IR here cost a twelfth of a typical schema's time to first mask.
    return ir.Grammar(rules, "root", "json_schema", check)
