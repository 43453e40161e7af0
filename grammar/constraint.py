"""``Constraint``: what a request constrains its output to, as one typed, hashable value.

A constraint is ``(kind, source, options)``: ``kind`` names the front end (``json_schema``,
``regex``, ``ebnf``, ``lark``, ``structural_tag``, ``choice``), ``source`` is its text in one
canonical spelling (a JSON schema is ``json.dumps`` of the parsed document once, key order kept:
properties are emitted in their listed order), ``options`` are the front end's options as sorted
``(name, value)`` pairs. It is built once (from ``SamplingParams`` by the engine, or by the
``compile_*`` entry points) and is the one key of every cache of compiled grammars: the
in-memory one (``api``), the engine backend's outcomes and the on-disk store (``disk_cache``),
whose file name is :attr:`Constraint.digest`. A JSON source keeps its parsed value beside it
(``value``, not part of equality), so nothing parses the same text twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from . import ir
from .budget import MAX_NESTING_DEPTH, check_document_depth
from .errors import GrammarBudgetError, GrammarError, SchemaError

KINDS = ("json_schema", "regex", "ebnf", "lark", "structural_tag", "choice")


@dataclass(frozen=True)
class Constraint:
    kind: str
    source: str
    options: tuple[tuple[str, Any], ...] = ()
    # The parsed source of the JSON kinds (schema document; structural tags), shared, read-only.
    value: Any = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown constraint kind {self.kind!r} (one of {', '.join(KINDS)})")

    # ------------------------------------------------------------------ builders
    @classmethod
    def json_schema(
        cls,
        schema: dict | str | bool,
        *,
        whitespace: str | int = "flexible",
        strict_properties: bool = False,
        max_whitespace: int | None = None,
        relax_keywords: Iterable[str] = (),
        max_nesting_depth: int = MAX_NESTING_DEPTH,
        draft: str | None = None,
        formats: str = "assert",
        property_order: str = "declared",
    ) -> "Constraint":
        """A JSON schema (object, boolean or JSON text); the text is parsed here, once."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except RecursionError:
                raise GrammarBudgetError(
                    f"the schema document nests deeper than Python's JSON parser reads, over the {2 * max_nesting_depth} "
                    f"levels allowed (two a subschema; CompileBudget.max_nesting_depth={max_nesting_depth})"
                ) from None
            except json.JSONDecodeError as exc:
                raise SchemaError(f"schema is not valid JSON: {exc}") from None
        check_document_depth(schema, "the schema document", max_nesting_depth)
        options: dict[str, Any] = dict(
            whitespace=whitespace, strict_properties=bool(strict_properties), relax_keywords=tuple(sorted(relax_keywords))
        )
        if max_whitespace is not None:
            options["max_whitespace"] = max_whitespace
        # Only options away from their defaults enter the key, so existing keys stay stable.
        if draft is not None:
            options["draft"] = draft
        if formats != "assert":
            options["formats"] = formats
        if property_order != "declared":
            options["property_order"] = property_order
        # Key order matters (properties are emitted in their listed order): never sort keys here.
        return cls("json_schema", json.dumps(schema), tuple(sorted(options.items())), schema)

    @classmethod
    def regex(cls, pattern: str, *, flavor: str = "python") -> "Constraint":
        return cls("regex", pattern, (("flavor", flavor),))

    @classmethod
    def ebnf(cls, text: str, *, root: str = "root") -> "Constraint":
        return cls("ebnf", text, (("root", root),))

    @classmethod
    def lark(cls, text: str, *, start: str = "start") -> "Constraint":
        return cls("lark", text, (("start", start),))

    @classmethod
    def structural_tag(cls, tags: list, triggers: list[str]) -> "Constraint":
        source = json.dumps([[getattr(t, "__dict__", t) for t in tags], list(triggers)], default=str)  # order matters
        return cls("structural_tag", source, (), (list(tags), list(triggers)))

    @classmethod
    def choice(cls, options: list[str]) -> "Constraint":
        if not options:
            raise GrammarError("choice needs at least one option")
        return cls("choice", json.dumps(list(options)), (), list(options))

    # ------------------------------------------------------------------ reading
    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    @property
    def digest(self) -> str:
        """A stable hex name of the constraint (the same in every process and version of Python)."""
        text = json.dumps([self.kind, self.source, [list(o) for o in self.options]], default=repr)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def to_ir(self) -> ir.Grammar:
        """Run the front end (inside a compile scope: its steps count against the budget)."""
        opts = dict(self.options)
        if self.kind == "json_schema":
            from .json_schema import json_schema_to_grammar

            value = self.value if self.value is not None else json.loads(self.source)
            return json_schema_to_grammar(value, **opts)
        if self.kind == "regex":
            from .regex import regex_to_ir

            return ir.Grammar({"root": regex_to_ir(self.source, flavor=opts["flavor"], mode="fullmatch")}, "root", "regex")
        if self.kind == "ebnf":
            from .ebnf import ebnf_to_grammar

            return ebnf_to_grammar(self.source, root=opts["root"])
        if self.kind == "lark":
            from .lark_grammar import lark_to_grammar

            return lark_to_grammar(self.source, start=opts["start"])
        if self.kind == "structural_tag":
            from .structural_tag import structural_tag_to_grammar

            tags, triggers = self.value
            return structural_tag_to_grammar(tags, triggers)
        from .structural_tag import choice_to_grammar

        return choice_to_grammar(list(self.value if self.value is not None else json.loads(self.source)))
