"""Tool calling: how tools reach the prompt, how calls are constrained, and how calls are read
back out of the text (whole or streamed).

The call syntax is the model family's (``tool_formats``: Hermes / Qwen, Llama 3 JSON, Mistral
``[TOOL_CALLS]`` or the generic JSON object); Hermes' by default::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

How each ``tool_choice`` is enforced (``tool_mode`` names it; always through ``SamplingParams``):

* ``auto`` (the default when tools are given): a structural tag. Text is free until the format's
  trigger (``<tool_call>``, ``{"name"``, ``[TOOL_CALLS]``); from there the grammar forces one
  tool's ``begin`` (which contains its name), a JSON body valid against that tool's
  ``parameters`` and the ``end``. So a call, when the model makes one, always parses and its
  arguments validate. With ``parallel_tool_calls=false`` the request also stops at the first
  ``</tool_call>`` (Hermes; other syntaxes have no such stop string, so later calls are dropped). Budget-aware closing lets a call start only
  when the grammar can still finish it within ``max_tokens`` (counting a byte per token): leave
  room for a whole call, or the model is steered to write around the trigger.
* ``required``: the whole output is a JSON array of ``{"name", "arguments"}`` objects, each
  valid against its tool (``forced_call_schema``; at most one item when ``parallel_tool_calls``
  is false).
* a named function: the whole output is that function's arguments object (``forced_call_schema``).
* ``none``: no constraint, and the tools are left out of the prompt so the model is not invited
  to call them.

Prompting: a chat template that renders ``tools`` itself gets them (and tool turns) as
Hugging Face templates expect them. Otherwise (SmolLM2-135M's template ignores tools) the tools go
into a system message that describes the call syntax, assistant turns that called tools are
rendered in that syntax, and tool results are turns of role ``tool``.

Reading calls back: one ``ToolCallParser`` per choice and per mode, fed the text deltas in order.
It emits ``ParsedContent`` / ``ParsedCallStart`` / ``ParsedArguments`` events; the non-streaming
response is built from the same events, so a streamed and a whole answer always agree.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from ..sampling_params import InvalidSamplingParams
from .tool_formats import HERMES, ToolCallFormat

# Hermes' syntax, the default.
CALL_OPEN = HERMES.trigger
CALL_CLOSE = "</tool_call>"
# The text that ends a call: the closing brace of {"name": ..., "arguments": ...}, then the tag.
CALL_END = HERMES.end

ToolMode = Literal["none", "auto", "required", "named"]


def call_begin(name: str) -> str:
    """The fixed text of a Hermes call up to its arguments object."""
    return HERMES.begin(name)


def render_call(name: str, arguments: str, fmt: ToolCallFormat = HERMES) -> str:
    return fmt.render(name, arguments)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tool_mode(tools: list[dict] | None, tool_choice: Any) -> ToolMode:
    """Which of the four behaviours a request asks for (OpenAI: ``auto`` when tools are given)."""
    if not tools or tool_choice == "none":
        return "none"
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice == "required":
        return "required"
    return "named"


def auto_structural_tag(tools: list[dict], fmt: ToolCallFormat = HERMES) -> dict[str, Any]:
    """The structural tag for ``auto``: free text, then calls in ``fmt``'s syntax."""
    structures = [
        {"begin": fmt.begin(t["function"]["name"]), "schema": t["function"].get("parameters") or {"type": "object"}, "end": fmt.end}
        for t in tools
    ]
    return {"structures": structures, "triggers": [fmt.trigger]}


def forced_call_schema(choice: Any, tools: Any, parallel: bool = True) -> dict[str, Any]:
    """The JSON Schema of the whole output for ``tool_choice`` ``required`` or a named function;
    ``InvalidSamplingParams`` naming ``tool_choice`` / ``tools`` for anything else."""
    if not tools:
        raise InvalidSamplingParams("tool_choice", "requires a non-empty 'tools' list")
    functions = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise InvalidSamplingParams("tools", f"each tool needs a function with a name, got {tool!r}")
        functions[fn["name"]] = fn.get("parameters") or {"type": "object"}
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, schema in functions.items()
        ]
        array = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        return array if parallel else {**array, "maxItems": 1}
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in functions:
            raise InvalidSamplingParams("tool_choice", f"names unknown function {name!r}")
        return functions[name]
    raise InvalidSamplingParams("tool_choice", f"must be none, auto, required or a named function, got {choice!r}")


# ---------------------------------------------------------------------------------- prompting


def tools_system_prompt(tools: list[dict], fmt: ToolCallFormat = HERMES) -> str:
    listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return (
        "You can call functions to answer the user. The functions, described as JSON Schema, are listed "
        f"between <tools></tools>:\n<tools>\n{listing}\n</tools>\n"
        "To call a function, reply with a JSON object that names it and gives its arguments, "
        f"written exactly like this:\n{fmt.example()}"
    )


def prompt_messages(
    messages: list[dict], tools: list[dict] | None, template_renders_tools: bool, fmt: ToolCallFormat = HERMES
) -> tuple[list[dict], list[dict] | None]:
    """Messages (plain dicts with text content) and the ``tools`` argument for the chat template."""
    if template_renders_tools:
        return [_for_template(m) for m in messages], tools or None
    rendered = [_as_text_turn(m, fmt) for m in messages]
    if tools:
        prompt = tools_system_prompt(tools, fmt)
        if rendered and rendered[0]["role"] == "system":
            rendered[0] = {"role": "system", "content": f"{prompt}\n\n{rendered[0]['content']}"}
        else:
            rendered.insert(0, {"role": "system", "content": prompt})
    return rendered, None


def _as_text_turn(message: dict, fmt: ToolCallFormat = HERMES) -> dict:
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if calls:
        rendered = "\n".join(fmt.render(c["function"]["name"], c["function"]["arguments"]) for c in calls)
        content = f"{content}\n{rendered}" if content else rendered
    return {"role": message["role"], "content": content}


def _for_template(message: dict) -> dict:
    """Hugging Face templates take a call's arguments as an object, not as JSON text."""
    out = {k: v for k, v in message.items() if v is not None}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": _json_or_text(c["function"]["arguments"])}}
            for c in message["tool_calls"]
        ]
    out.setdefault("content", "")
    return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# ---------------------------------------------------------------------------------- parsing


@dataclass
class ParsedContent:
    text: str


@dataclass
class ParsedCallStart:
    index: int
    id: str
    name: str


@dataclass
class ParsedArguments:
    index: int
    text: str


ParsedEvent = Union[ParsedContent, ParsedCallStart, ParsedArguments]


class ToolCallParser:
    """Base: ``feed`` text deltas in order, then ``finish`` once; both return events."""

    def feed(self, text: str) -> list[ParsedEvent]:
        raise NotImplementedError

    def finish(self) -> list[ParsedEvent]:
        raise NotImplementedError


class PlainParser(ToolCallParser):
    """No tools: everything is content."""

    def feed(self, text: str) -> list[ParsedEvent]:
        return [ParsedContent(text)] if text else []

    def finish(self) -> list[ParsedEvent]:
        return []


@dataclass
class JsonNesting:
    """Bracket depth of JSON text read one character at a time, strings (and their escapes)
    skipped: where a streamed object or array closes."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def step(self, c: str) -> int:
        """+1 where ``c`` opens an object or array, -1 where it closes one, else 0."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif c == "\\":
                self.escaped = True
            elif c == '"':
                self.in_string = False
        elif c == '"':
            self.in_string = True
        elif c in "[{":
            self.depth += 1
            return 1
        elif c in "]}":
            self.depth -= 1
            return -1
        return 0


class TaggedCallParser(ToolCallParser):
    """``auto``: content, and calls written in ``fmt``'s syntax (``begin(name)``, an arguments
    object, ``end``).

    Text that may be the start of the trigger (or of a dropped marker) is held back until the next
    delta settles it. Arguments stream as they come; their end is found by following the JSON
    object's nesting (strings and escapes included), so an ``end`` that also occurs inside the
    arguments (Llama 3's ``}``) is never mistaken. Trailing whitespace (and the format's call
    separators) is held too, and dropped at the end if calls were made. With ``max_calls``, text
    after that many calls is dropped (``parallel_tool_calls=false`` for syntaxes with no stop).
    """

    def __init__(self, tool_names: list[str], fmt: ToolCallFormat = HERMES, max_calls: int | None = None) -> None:
        self.fmt = fmt
        self.begins = {fmt.begin(n): n for n in tool_names}
        self.markers = (fmt.trigger, *fmt.dropped)
        self.max_calls = max_calls
        self.buffer = ""
        self.call_index: int | None = None  # index of the call whose arguments are being read
        self.in_end = False  # the arguments closed; the format's end text is being read
        self.calls = 0
        self.pending_space = ""
        self._nesting = JsonNesting()

    def feed(self, text: str) -> list[ParsedEvent]:
        if self.max_calls is not None and self.calls >= self.max_calls and self.call_index is None and not self.in_end:
            return []
        self.buffer += text
        events: list[ParsedEvent] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[ParsedEvent]:
        events: list[ParsedEvent] = []
        if self.call_index is not None:  # cut inside a call (length): hand out what there is
            if self.buffer:
                events.append(ParsedArguments(self.call_index, self.buffer))
        elif not self.in_end and not self._done():
            self._content(self.buffer, events)
            if self.pending_space and not self.calls:
                events.append(ParsedContent(self.pending_space))
        self.buffer = self.pending_space = ""
        return events

    def _done(self) -> bool:
        return self.max_calls is not None and self.calls >= self.max_calls

    def _step(self, events: list[ParsedEvent]) -> bool:
        """Consume what can be decided from the buffer; True if there may be more to do."""
        if self.call_index is not None:
            return self._arguments(events)
        if self.in_end:
            end = self.fmt.end
            if self.buffer.startswith(end) or not end.startswith(self.buffer[: len(end)]):
                # The end as written, or (unconstrained) something else: the call is over.
                self.buffer = self.buffer[len(end) :] if self.buffer.startswith(end) else self.buffer
                self.in_end = False
                if self._done():
                    self.buffer = ""
                    return False
                return True
            return False  # the end is still arriving
        hits = [(self.buffer.find(m), m) for m in self.markers]
        hits = [(i, m) for i, m in hits if i >= 0]
        if not hits:
            keep = max(_partial_suffix(self.buffer, m) for m in self.markers)
            self._content(self.buffer[: len(self.buffer) - keep], events)
            self.buffer = self.buffer[len(self.buffer) - keep :]
            return False
        start, marker = min(hits)
        self._content(self.buffer[:start], events)
        self.buffer = self.buffer[start:]
        if marker != self.fmt.trigger:  # a dropped marker
            self.buffer = self.buffer[len(marker) :]
            return True
        for begin, name in self.begins.items():
            if self.buffer.startswith(begin):
                self.call_index, self.calls = self.calls, self.calls + 1
                events.append(ParsedCallStart(self.call_index, new_call_id(), name))
                self.buffer = self.buffer[len(begin) :]
                self._nesting = JsonNesting()
                return True
        if any(begin.startswith(self.buffer) for begin in self.begins):
            return False  # the begin is still arriving
        # Not a call after all (only possible without the constraint): the trigger is text.
        self._content(self.fmt.trigger, events)
        self.buffer = self.buffer[len(self.fmt.trigger) :]
        return True

    def _arguments(self, events: list[ParsedEvent]) -> bool:
        """Hand out arguments up to the close of their object; then read the end."""
        assert self.call_index is not None
        for i, c in enumerate(self.buffer):
            if self._nesting.step(c) < 0 and self._nesting.depth <= 0:
                events.append(ParsedArguments(self.call_index, self.buffer[: i + 1]))
                self.buffer = self.buffer[i + 1 :]
                self.call_index, self.in_end = None, True
                return True
        if self.buffer:
            events.append(ParsedArguments(self.call_index, self.buffer))
            self.buffer = ""
        return False

    def _content(self, text: str, events: list[ParsedEvent]) -> None:
        """Emit content, holding trailing whitespace (and, once calls were made, call separators)
        until more text shows it is not the last."""
        if self._done():
            return
        body = text.rstrip(_SPACE + (self.fmt.separators if self.calls else ""))
        if body:
            events.append(ParsedContent(self.pending_space + body))
            self.pending_space = ""
        self.pending_space += text[len(body) :]


_SPACE = " \t\r\n"


class HermesParser(TaggedCallParser):
    """``auto`` in the Hermes syntax (kept for callers that name it)."""

    def __init__(self, tool_names: list[str]) -> None:
        super().__init__(tool_names, HERMES)


class CallArrayParser(ToolCallParser):
    """``required``: a JSON array of ``{"name", "arguments"}``; a call is handed out whole once
    its object closes. If nothing parses (the output was cut), the text is returned as content."""

    def __init__(self) -> None:
        self.text = ""
        self.scanned = 0
        self.nesting = JsonNesting()
        self.item_start = -1
        self.calls = 0

    def feed(self, text: str) -> list[ParsedEvent]:
        self.text += text
        events: list[ParsedEvent] = []
        for i in range(self.scanned, len(self.text)):
            self._scan(i, events)
        self.scanned = len(self.text)
        return events

    def finish(self) -> list[ParsedEvent]:
        return [] if self.calls or not self.text else [ParsedContent(self.text)]

    def _scan(self, i: int, events: list[ParsedEvent]) -> None:
        move = self.nesting.step(self.text[i])
        if move > 0 and self.nesting.depth == 2:
            self.item_start = i
        elif move < 0 and self.nesting.depth == 1 and self.item_start >= 0:
            self._item(self.text[self.item_start : i + 1], events)
            self.item_start = -1

    def _item(self, text: str, events: list[ParsedEvent]) -> None:
        try:
            item = json.loads(text)
            name, arguments = item["name"], item["arguments"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return
        index, self.calls = self.calls, self.calls + 1
        events.append(ParsedCallStart(index, new_call_id(), str(name)))
        events.append(ParsedArguments(index, json.dumps(arguments, ensure_ascii=False)))


class NamedCallParser(ToolCallParser):
    """A named function: the whole output is its arguments, streamed as they come."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False

    def feed(self, text: str) -> list[ParsedEvent]:
        events = self._start()
        if text:
            events.append(ParsedArguments(0, text))
        return events

    def finish(self) -> list[ParsedEvent]:
        return self._start()

    def _start(self) -> list[ParsedEvent]:
        if self.started:
            return []
        self.started = True
        return [ParsedCallStart(0, new_call_id(), self.name)]


def make_parser(
    mode: ToolMode, tools: list[dict] | None, tool_choice: Any, fmt: ToolCallFormat = HERMES, max_calls: int | None = None
) -> ToolCallParser:
    if mode == "auto":
        return TaggedCallParser([t["function"]["name"] for t in tools or []], fmt, max_calls)
    if mode == "required":
        return CallArrayParser()
    if mode == "named":
        return NamedCallParser(tool_choice["function"]["name"])
    return PlainParser()


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass
class CollectedMessage:
    """Events folded into an assistant message (for the non-streaming response)."""

    content: list[str] = field(default_factory=list)
    calls: list[dict[str, str]] = field(default_factory=list)

    def add(self, events: list[ParsedEvent]) -> None:
        for e in events:
            if isinstance(e, ParsedContent):
                self.content.append(e.text)
            elif isinstance(e, ParsedCallStart):
                self.calls.append({"id": e.id, "name": e.name, "arguments": ""})
            else:
                self.calls[e.index]["arguments"] += e.text

    @property
    def text(self) -> str | None:
        text = "".join(self.content)
        return text if text or not self.calls else None
