"""Schema loading: metaschema check, and ``$ref`` normalization to root JSON pointers.

After :func:`normalize_refs`, every ``$ref`` in the document is ``"#<pointer from the root>"``
and ``$id`` / ``$anchor`` are gone, so the lowering resolves references with one pointer walk
and never tracks base URIs. Draft-07 and 2019-09 spellings are accepted alongside 2020-12.

``$dynamicRef`` keeps what its dynamic resolution needs (:class:`Dynamic`): its initial target
(resolved like ``$ref``), the anchor name when that target carries the same ``$dynamicAnchor``
(the 2020-12 "bookend"; otherwise it is a plain ``$ref``), and per schema resource the dynamic
anchors it defines. The lowering binds, for each name, the outermost resource in the dynamic
scope that defines it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

import jsonschema
from jsonschema import exceptions as js_exceptions
from jsonschema import validators

from ..budget import check_document_depth
from ..caches import CACHES
from ..errors import GrammarBudgetError, SchemaError, UnsupportedFeatureError
from .drafts import RECURSIVE, Draft, draft_of

DEFAULT_BASE = "https://formcast.invalid/schema.json"
_SINGLE = ("additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if", "then", "else",
           "unevaluatedItems", "unevaluatedProperties", "items")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
# Maps of named subschemas whose names the metaschema does not check (patternProperties' names
# are regexes it does check, so that map is kept whole).
_NAMED_SUBSCHEMAS = ("properties", "$defs", "definitions", "dependentSchemas")


def load_schema(schema: dict | str | bool, draft_option: str | None = None) -> tuple[Any, type, Draft | None]:
    """Parse JSON text, check the schema against its metaschema, return it with its validator
    class and its named draft (``drafts.draft_of``): the class of its ``$schema``, else of the
    option's draft, else 2020-12 (or draft-07 for a schema only draft-07 accepts)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"schema is not valid JSON: {exc}") from exc
        except RecursionError:
            raise GrammarBudgetError("the schema document nests too deeply to parse (CompileBudget.max_nesting_depth)") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a schema must be an object or a boolean, got {type(schema).__name__}")
    check_document_depth(schema, "the schema document")  # before the metaschema check recurses over it
    draft = draft_of(schema, draft_option)
    default = draft.validator if draft is not None else jsonschema.Draft202012Validator
    cls = validators.validator_for(schema, default=default) if isinstance(schema, dict) else default
    if _valid_node_by_node(cls, schema):
        return schema, cls, draft
    distinct = _distinct_subschemas(schema)
    error = _check_schema(cls, distinct)
    if error is not None:
        # Schemas in the wild often use draft-07 spellings without saying so.
        if isinstance(schema, dict) and "$schema" not in schema and draft is None and (
            _valid_node_by_node(jsonschema.Draft7Validator, schema)
            or _check_schema(jsonschema.Draft7Validator, distinct) is None
        ):
            return schema, jsonschema.Draft7Validator, draft
        where = "/" + "/".join(str(p) for p in error.path)
        raise SchemaError(f"invalid schema at {where}: {error.message}") from error
    return schema, cls, draft


# Keywords whose value every supported draft's metaschema requires to be a schema, a list of
# schemas, or a map of named schemas (the positions ``_subschemas`` walks, and ``contentSchema``).
# A stricter guess here only costs speed: a node the node-by-node check cannot pass goes to the
# whole-document check, which decides.
_CHILD = _SINGLE + ("contentSchema",)
_FREE_TEXT = ("title", "description", "$comment")  # any string
_NODE_VERDICTS: dict[tuple[type, str], bool] = CACHES.table("schema_node_verdicts", setup=True)
_NODE_VERDICTS_MAX = 1 << 16


_TAKEN: dict = {}


def _take_child(child: Any, work: list) -> Any:
    """What stands in for a subschema in its parent's node: an object subschema is queued to be
    checked on its own and replaced by ``{}``; anything else (booleans, which draft 4 allows
    only in some positions, or a wrong type) stays for the parent's check to judge."""
    if isinstance(child, dict):
        work.append(child)
        return _TAKEN
    return child


def _valid_node_by_node(cls: type, schema: Any) -> bool:
    """True when the metaschema of ``cls`` accepts ``schema`` for sure; False means "ask the
    whole-document check" (which also words the error).

    Every supported metaschema judges a subschema by its content alone, so each node is checked
    on its own with its subschemas replaced by ``{}`` (valid in every draft), and verdicts are
    kept per node content: across schemas the same small nodes (``{"type": "string"}``) recur,
    and jsonschema's walk over the 2020-12 metaschema's dynamic references was a fifth of a
    median compile. Free text and ``default`` (any value) are checked here and left out of the
    key; map names the metaschema does not constrain are dropped."""
    meta = _meta_validator(cls)
    work = [schema]
    while work:
        node = work.pop()
        if isinstance(node, dict):
            shallow = dict(node)
            for key in _FREE_TEXT:
                if isinstance(shallow.get(key), str):
                    del shallow[key]
            shallow.pop("default", None)
            for key in _CHILD:
                if key in shallow:
                    shallow[key] = _take_child(shallow[key], work)
            for key in _LISTS:
                value = shallow.get(key)
                if isinstance(value, list) and value:
                    shallow[key] = [_take_child(child, work) for child in value]
            for key in _NAMED_SUBSCHEMAS:
                value = shallow.get(key)
                if isinstance(value, dict):
                    shallow[key] = {k: v for k, v in value.items() if _take_child(v, work) is not _TAKEN}
            value = shallow.get("patternProperties")
            if isinstance(value, dict):  # its names are checked (as regexes), its values are schemas
                shallow["patternProperties"] = {name: _take_child(child, work) for name, child in value.items()}
            node = shallow
        try:
            key = (cls, json.dumps(node, sort_keys=True))
        except (TypeError, ValueError):
            return False
        verdict = _NODE_VERDICTS.get(key)
        if verdict is None:
            verdict = meta.is_valid(node)
            if len(_NODE_VERDICTS) >= _NODE_VERDICTS_MAX:
                _NODE_VERDICTS.clear()
            _NODE_VERDICTS[key] = verdict
        if not verdict:
            return False
    return True




def _distinct_subschemas(schema: Any) -> Any:
    """The schema with each big map of named subschemas cut to one entry per distinct subschema:
    the metaschema judges a subschema by its content alone, so the verdict is the same, and 5,000
    properties of one shape are checked once instead of 5,000 times (the check dominated the
    compile of such schemas)."""
    if isinstance(schema, list):
        return [_distinct_subschemas(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _NAMED_SUBSCHEMAS and isinstance(value, dict) and len(value) > 16:
            seen: dict[str, str] = {}
            for name, sub in value.items():
                seen.setdefault(json.dumps(sub, sort_keys=True, default=repr), name)
            value = {name: value[name] for name in seen.values()}
        out[key] = _distinct_subschemas(value)
    return out


def _ecma_regex(text: object) -> bool:
    """The metaschema's ``format: regex``, checked as ECMA-262 (``pattern``'s dialect), not as
    Python's ``re``: ``\\p{Letter}`` is valid ECMA. Constructs we refuse still parse as regexes."""
    from ..errors import RegexSyntaxError
    from ..regex import regex_to_ir

    if not isinstance(text, str):
        return True
    try:
        regex_to_ir(text, flavor="ecma")
    except RegexSyntaxError:
        return False
    except Exception:
        return True
    return True


_META_VALIDATORS: dict[type, Any] = CACHES.table("schema_meta_validators", setup=True)


def _meta_validator(cls: type) -> Any:
    """One metaschema validator per draft (with ECMA regexes), kept: building it afresh for every
    schema also threw away the resolved references into the metaschema's vocabularies. A
    validator is immutable, so threads share it (a race builds two; either serves)."""
    meta = _META_VALIDATORS.get(cls)
    if meta is None:
        checker = copy.copy(cls.FORMAT_CHECKER)
        checker.checkers = dict(checker.checkers)
        checker.checkers["regex"] = (_ecma_regex, ())
        meta = _META_VALIDATORS[cls] = cls(cls.META_SCHEMA, format_checker=checker)
    return meta


def _check_schema(cls: type, schema: object) -> js_exceptions.SchemaError | None:
    """The best metaschema error of ``schema`` (None if valid), with ECMA regexes."""
    error = js_exceptions.best_match(_meta_validator(cls).iter_errors(schema))
    if error is None:
        return None
    return js_exceptions.SchemaError.create_from(error)


def pointer_escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def resolve_pointer(doc: Any, pointer: str) -> Any:
    """The node at JSON pointer ``pointer`` (``""`` is the root); SchemaError when absent."""
    node = doc
    if pointer == "":
        return node
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise SchemaError(f"$ref target #{pointer} does not exist")
    return node


def _subschemas(node: dict, pointer: str):
    """(child schema, its pointer) for every subschema position of ``node``."""
    for key in _SINGLE:
        if isinstance(node.get(key), (dict, bool)):
            yield node[key], f"{pointer}/{key}"
    for key in _LISTS:
        if isinstance(node.get(key), list):
            for i, child in enumerate(node[key]):
                yield child, f"{pointer}/{key}/{i}"
    for key in _MAPS:
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                if isinstance(child, (dict, bool)):
                    yield child, f"{pointer}/{key}/{pointer_escape(name)}"


@dataclass
class Dynamic:
    """What ``$dynamicRef`` resolution needs (see the module docstring); empty without one."""

    refs: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # node -> (target, anchor name)
    anchors: dict[str, dict[str, str]] = field(default_factory=dict)  # resource root -> name -> node
    roots: frozenset[str] = frozenset()  # pointers of the schema resources

    def resource_of(self, pointer: str) -> str:
        while pointer not in self.roots:
            pointer = pointer[: pointer.rfind("/")] if pointer else ""
        return pointer


def normalize_refs(schema: Any, dynamic: Dynamic | None = None, draft: Draft | None = None) -> Any:
    """A copy of ``schema`` where each ``$ref`` is a root pointer ``#/...`` (see module doc);
    ``dynamic`` is filled for ``$dynamicRef`` (and 2019-09's ``$recursiveRef``). Under a named
    ``draft``, identifiers follow its rules (``drafts``)."""
    doc = copy.deepcopy(schema)
    if not isinstance(doc, dict):
        return doc
    id_key = draft.id_keyword if draft is not None else "$id"
    recursive = draft is not None and draft.name == "2019-09"
    dynamic_kw = draft is None or draft.name == "2020-12"
    resources: dict[str, str] = {}  # base URI -> pointer of the resource root
    anchors: dict[tuple[str, str], str] = {}
    dyn_anchors: dict[str, dict[str, str]] = {}
    refs: list[tuple[dict, str]] = []  # (node, base) whose $ref needs rewriting
    dyn_refs: list[tuple[dict, str, str]] = []  # (node, base, pointer) with a $dynamicRef

    root_base = DEFAULT_BASE
    if isinstance(doc.get(id_key), str) and not (draft is not None and draft.ref_overrides and "$ref" in doc):
        root_base = urldefrag(urljoin(DEFAULT_BASE, doc[id_key]))[0] or DEFAULT_BASE
    resources[root_base] = ""
    # Depth first in document order, with a stack (a recursive closure would be a reference cycle
    # holding the whole document until the cyclic collector runs).
    stack: list[tuple[Any, str, str]] = [(doc, "", root_base)]
    while stack:
        node, pointer, base = stack.pop()
        if not isinstance(node, dict):
            continue
        if not dynamic_kw:  # unknown keywords before 2020-12
            node.pop("$dynamicRef", None)
            node.pop("$dynamicAnchor", None)
        # Up to draft-07, $ref overrides its siblings: a sibling $id changes no base URI.
        ids_apply = not (draft is not None and draft.ref_overrides and "$ref" in node)
        if ids_apply and isinstance(node.get(id_key), str):
            uri, frag = urldefrag(_join(base, node[id_key]))
            if uri:
                base = uri
                resources.setdefault(base, pointer)
            if frag and not frag.startswith("/"):  # draft-07 "$id": "#anchor"
                anchors[(base, frag)] = pointer
        for key in ("$anchor", "$dynamicAnchor") if ids_apply else ():
            if isinstance(node.get(key), str):
                anchors[(base, node[key])] = pointer
        if isinstance(node.get("$dynamicAnchor"), str):
            dyn_anchors.setdefault(resources[base], {})[node["$dynamicAnchor"]] = pointer
        if recursive and node.get("$recursiveAnchor") is True and resources.get(base) == pointer:
            dyn_anchors.setdefault(pointer, {})[RECURSIVE] = pointer
        if recursive and isinstance(node.get("$recursiveRef"), str):
            dyn_refs.append((node, base, pointer))
        if isinstance(node.get("$ref"), str):
            refs.append((node, base))
        if isinstance(node.get("$dynamicRef"), str):
            dyn_refs.append((node, base, pointer))
        stack.extend((child, child_ptr, base) for child, child_ptr in reversed(list(_subschemas(node, pointer))))
    for node, base in refs:
        node["$ref"] = "#" + _target(node["$ref"], base, resources, anchors, doc)
    for node, base, pointer in dyn_refs:
        if "$recursiveRef" in node:
            # 2019-09: dynamic when its target (a resource root) says $recursiveAnchor: true.
            target = _target(node.pop("$recursiveRef"), base, resources, anchors, doc)
            node_at = resolve_pointer(doc, target)
            name = RECURSIVE if isinstance(node_at, dict) and node_at.get("$recursiveAnchor") is True else None
            node["$dynamicRef"] = "#" + target
            if dynamic is not None:
                dynamic.refs[pointer] = (target, name)
            continue
        ref = node["$dynamicRef"]
        target = _target(ref, base, resources, anchors, doc)
        name = unquote(urldefrag(_join(base, ref))[1])
        node_at = resolve_pointer(doc, target)
        bookended = bool(name) and not name.startswith("/") and isinstance(node_at, dict) and node_at.get("$dynamicAnchor") == name
        node["$dynamicRef"] = "#" + target
        if dynamic is not None:
            dynamic.refs[pointer] = (target, name if bookended else None)
    if dynamic is not None:
        dynamic.anchors = dyn_anchors
        dynamic.roots = frozenset(resources.values())
    _strip_ids(doc, id_key)
    return doc


def _join(base: str, ref: str) -> str:
    """``urljoin``, plus the fragment-only references that ``urljoin`` leaves alone for
    non-hierarchical bases (``urn:uuid:...``)."""
    if ref.startswith("#"):
        return urldefrag(base)[0] + ref
    return urljoin(base, ref)


def _target(ref: str, base: str, resources: dict[str, str], anchors: dict[tuple[str, str], str], doc: Any) -> str:
    uri, frag = urldefrag(_join(base, ref))
    if uri not in resources:
        raise UnsupportedFeatureError(f"$ref {ref!r} points outside the schema document (remote references are not fetched)")
    frag = unquote(frag)
    if frag == "" or frag.startswith("/"):
        pointer = resources[uri] + frag
        resolve_pointer(doc, pointer)
        return pointer
    if (uri, frag) not in anchors:
        raise SchemaError(f"$ref {ref!r}: anchor {frag!r} is not defined")
    return anchors[(uri, frag)]


def _strip_ids(node: Any, id_key: str = "$id") -> None:
    if isinstance(node, dict):
        for key in ("$id", "$anchor", "$dynamicAnchor", "$schema", id_key):
            if isinstance(node.get(key), str):
                del node[key]
        for child, _ in _subschemas(node, ""):
            _strip_ids(child, id_key)
