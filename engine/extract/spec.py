"""``ExtractSpec``: what every record of a job is asked (the constraint, the prompt, sampling).

The prompt template is Python ``str.format`` text over the record's fields: ``{text}`` is the
document (the record's ``field``, ``text`` by default), any other ``{name}`` is the record's field
of that name; write ``{{`` and ``}}`` for literal braces. With ``chat`` (the default) the rendered
prompt is the user message of the model's chat template.

The spec is plain data (it travels to Ray actors as JSON); the sampling fields are
``SamplingParams`` fields, and the constraint is one of ``json_schema``, ``regex``, ``ebnf``, so it
goes through the same ``SamplingParams`` and grammar backend as every other request.
"""

from __future__ import annotations

import dataclasses
import string
import zlib
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from ..sampling_params import SamplingParams
from .results import ExtractError, FailureType

CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf")


class RecordError(ValueError):
    """A record the prompt cannot be built from; carries its ``ExtractError``."""

    def __init__(self, error: ExtractError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class ExtractSpec:
    constraint: dict[str, Any] = dataclass_field(default_factory=dict)  # {} or one of CONSTRAINT_FIELDS
    prompt_template: str = "{text}"
    field: str = "text"  # the record field that fills {text}
    id_field: str = "id"
    chat: bool = True
    sampling: dict[str, Any] = dataclass_field(default_factory=lambda: {"max_new_tokens": 128, "temperature": 0.0})
    placeholders: list[str] = dataclass_field(init=False, repr=False)  # filled by __post_init__

    def __post_init__(self) -> None:
        self.placeholders = template_fields(self.prompt_template)
        unknown = sorted(set(self.constraint) - set(CONSTRAINT_FIELDS))
        if unknown or len(self.constraint) > 1:
            raise ValueError(f"the constraint must be one of {', '.join(CONSTRAINT_FIELDS)}, got {sorted(self.constraint)}")

    @property
    def kind(self) -> str | None:
        """The constraint's field name (``json_schema``, ``regex``, ``ebnf``), or None."""
        return next(iter(self.constraint), None)

    def sampling_params(self) -> SamplingParams:
        """The job's ``SamplingParams`` (raises ``InvalidSamplingParams`` for a bad field)."""
        known = {f.name for f in dataclasses.fields(SamplingParams) if f.init}
        unknown = sorted(set(self.sampling) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}")
        params = SamplingParams(**self.sampling, **self.constraint)
        params.normalize()
        params.verify()
        return params

    def params_for(self, params: SamplingParams, key: str) -> SamplingParams:
        """Per-record params: a seeded job gives each record its own seed, derived from its id,
        so a rerun samples a record the same way whatever else runs beside it."""
        if params.sampling_seed is None:
            return params
        seed = (params.sampling_seed * 1_000_003 + zlib.crc32(key.encode("utf-8"))) % (2**63)
        return dataclasses.replace(params, sampling_seed=seed)

    def render(self, fields: dict[str, Any], line: int) -> str:
        """The prompt text of one record; ``RecordError`` names what is missing."""
        document = fields.get(self.field)
        if not isinstance(document, str):
            got = "it is missing" if self.field not in fields else f"got {type(document).__name__}"
            raise RecordError(ExtractError(FailureType.INVALID_RECORD, f"line {line}: field {self.field!r} must be a string; {got}"))
        values = {**fields, "text": document}
        missing = [name for name in self.placeholders if name not in values]
        if missing:
            raise RecordError(ExtractError(FailureType.INVALID_RECORD, f"line {line}: no field {missing[0]!r} (used by the prompt template)"))
        try:
            return self.prompt_template.format_map(values)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise RecordError(ExtractError(FailureType.INVALID_RECORD, f"line {line}: the prompt template cannot render this record ({type(exc).__name__}: {exc})")) from None

    def to_json(self) -> dict[str, Any]:
        return {"constraint": self.constraint, "prompt_template": self.prompt_template, "field": self.field,
                "id_field": self.id_field, "chat": self.chat, "sampling": self.sampling}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExtractSpec:
        return cls(**data)


def template_fields(template: str) -> list[str]:
    """The field names a template uses (``{a.b}`` and ``{a[0]}`` use ``a``); ``ValueError`` if malformed."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"prompt template: {exc} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _, name, _, _ in parts:
        if name is None:
            continue
        root = name.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValueError(f"prompt template: use field names in braces, like {{text}}, not {{{name}}}")
        names.append(root)
    return list(dict.fromkeys(names))
