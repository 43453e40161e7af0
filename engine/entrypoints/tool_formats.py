"""Tool-call syntaxes per model family: how a call looks in the model's text, which text starts
one (the structural tag's trigger), and which syntax a model uses.

Each ``ToolCallFormat`` writes one call as ``begin(name) + <arguments JSON object> + end``:

* ``hermes`` (alias ``qwen``; Qwen2.5/3, Hermes, SmolLM2): ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``
* ``llama3``: ``{"name": "f", "parameters": {...}}``, with or without a leading ``<|python_tag|>``
  (dropped when read), calls separated by ``;``
* ``mistral``: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}]``
* ``json`` (the generic fallback): ``{"name": "f", "arguments": {...}}`` anywhere in the text

The trigger is the prefix of ``begin`` the model writes freely; from it on, the ``auto`` structural
tag forces the rest of ``begin`` for one of the tools, arguments valid against its schema, and
``end`` (``tool_calls.auto_structural_tag``). ``detect_format`` picks the syntax from the chat
template (the call syntax it renders), then from the model family; ``EngineArgs.tool_call_parser``
(``formcast serve --tool-call-parser``) overrides it. Models whose template does not describe
tools (SmolLM2-135M) get ``hermes``, which formcast's own tools prompt describes.

Markers that are control tokens: Mistral's ``[TOOL_CALLS]`` and Llama 3's ``<|python_tag|>`` are
single special tokens of their tokenizers. A grammar never produces a special token and the
detokenizer drops them (``skip_special_tokens``), so the call would be neither constrained at the
trigger the model actually writes nor seen by the parser. ``marker_token_texts`` finds the
format's markers that the tokenizer spells as one special token, and the Engine makes those plain
text tokens of its vocabulary (``TokenVocabulary.with_text_tokens``): the structural tag's trigger
then matches the model's own token and the parser reads the marker in the text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    trigger: str  # the text that opens a call; begin(name) starts with it
    head: str  # begin(name) is head.format(name=<JSON string of the name>)
    end: str  # the text after the arguments object
    # Markers a model may write around calls that are not part of any answer (dropped when read).
    dropped: tuple[str, ...] = ()
    # Separator characters between consecutive calls (dropped when read, like the whitespace).
    separators: str = ""
    # A stop string that ends the first call (parallel_tool_calls=false), if the syntax has one
    # that cannot occur inside the arguments; without one, later calls are dropped when read.
    close: str | None = None

    def begin(self, name: str) -> str:
        return self.head.format(name=json.dumps(name, ensure_ascii=False))

    def render(self, name: str, arguments: str) -> str:
        return self.begin(name) + arguments + self.end

    def example(self) -> str:
        """The syntax with placeholders, for a system prompt that describes it."""
        return self.head.format(name='"<function name>"') + "<arguments as a JSON object>" + self.end


HERMES = ToolCallFormat("hermes", "<tool_call>", '<tool_call>\n{{"name": {name}, "arguments": ', "}\n</tool_call>", close="</tool_call>")
LLAMA3 = ToolCallFormat("llama3", '{"name"', '{{"name": {name}, "parameters": ', "}", dropped=("<|python_tag|>",), separators=";")
MISTRAL = ToolCallFormat("mistral", "[TOOL_CALLS]", '[TOOL_CALLS][{{"name": {name}, "arguments": ', "}]")
JSON = ToolCallFormat("json", '{"name"', '{{"name": {name}, "arguments": ', "}")

FORMATS: dict[str, ToolCallFormat] = {"hermes": HERMES, "qwen": HERMES, "llama3": LLAMA3, "mistral": MISTRAL, "json": JSON}

# Model families (a config's model_type or architecture, lower case) whose syntax is known when
# the template says nothing.
_FAMILY_HINTS = (("qwen", HERMES), ("hermes", HERMES), ("mistral", MISTRAL), ("mixtral", MISTRAL))


def marker_token_texts(fmt: ToolCallFormat, tokenizer: Any, special_token_ids: frozenset[int]) -> dict[int, bytes]:
    """{token id: marker bytes} for the markers of ``fmt`` (its trigger and dropped markers) that
    ``tokenizer`` encodes as one special token."""
    out: dict[int, bytes] = {}
    for marker in (fmt.trigger, *fmt.dropped):
        ids = list(tokenizer.encode(marker, add_special_tokens=False))
        if len(ids) == 1 and ids[0] in special_token_ids:
            out[int(ids[0])] = marker.encode("utf-8")
    return out


def get_format(name: str) -> ToolCallFormat:
    """The format called ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"tool_call_parser must be one of {sorted(FORMATS)}, got {name!r}") from None


def detect_format(chat_template: str | None, family: str | None = None, override: str | None = None) -> ToolCallFormat:
    """The syntax to constrain and read calls in: ``override`` if given, else what the chat
    template renders, else the model family's, else ``hermes``."""
    if override:
        return get_format(override)
    template = chat_template or ""
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or ('"parameters"' in template and "<|start_header_id|>" in template):
        return LLAMA3
    fam = (family or "").lower()
    for hint, fmt in _FAMILY_HINTS:
        if hint in fam:
            return fmt
    return HERMES
