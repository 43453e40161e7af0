"""Reasoning sections (``<think>...</think>``, Qwen3 / DeepSeek-R1 style): where they end, and
the answer's text apart from the reasoning.

With ``EngineArgs.reasoning_end`` set (``formcast serve --reasoning-end '</think>'``) the
engine applies a request's constraint from the end of the reasoning on, and the chat endpoint
returns the reasoning as ``reasoning_content`` (streamed as such too), apart from ``content``.
The start tag is the end tag without its slash. A chat template may close the block in the
prompt (Qwen3 with ``enable_thinking: false`` renders an empty ``<think></think>``): then there
is no reasoning to wait for and the constraint applies from the first token
(``prompt_closes_reasoning``, also used by the scheduler).
``EngineArgs.reasoning_parser`` names the syntax instead (``qwen3``, ``deepseek-r1``: ``</think>``).
A thinking budget (``SamplingParams.max_reasoning_tokens``) is enforced by the output processor,
which appends the end tag itself; an output that ends inside the reasoning is reported by the
chat endpoint with ``finish_reason`` ``reasoning_length`` / ``reasoning_stop``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Prompt characters searched for an open or closed reasoning block: the generation prompt's tail.
PROMPT_TAIL_CHARS = 256


def reasoning_start(end: str) -> str:
    return end.replace("</", "<", 1)


def prompt_closes_reasoning(prompt_text: str, end: str) -> bool:
    """The prompt's tail holds a reasoning block that is already closed."""
    tail = prompt_text[-PROMPT_TAIL_CHARS:]
    closed = tail.rfind(end)
    return closed >= 0 and closed > tail.rfind(reasoning_start(end))


@dataclass
class ReasoningSplitter:
    """Fed the text deltas in order; each ``feed`` returns ``(reasoning, content)`` deltas. Text
    that may be the start of a tag is held back until the next delta settles it; the start tag
    and the newlines around the end tag are dropped."""

    end: str
    done: bool = False  # the reasoning is over (or there was none)
    buffer: str = ""  # after the start: text that may begin the end tag
    pending: str = ""  # before the start is settled: text that may be the start tag
    started: bool = False
    after_tag: bool = False
    content_started: bool = False

    def feed(self, text: str) -> tuple[str, str]:
        if self.done:
            return "", self._content(text)
        self.buffer += text
        cut = self.buffer.find(self.end)
        if cut >= 0:
            reasoning, content = self.buffer[:cut], self.buffer[cut + len(self.end) :]
            self.buffer, self.done = "", True
            return self._reasoning(reasoning, final=True), self._content(content)
        keep = _partial_suffix(self.buffer, self.end)
        out, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep :]
        return self._reasoning(out), ""

    def finish(self) -> tuple[str, str]:
        """What is left when the output ends (inside the reasoning: all of it is reasoning)."""
        rest, self.buffer = self.buffer, ""
        return ("", self._content(rest)) if self.done else (self._reasoning(rest, final=True), "")

    def _reasoning(self, text: str, final: bool = False) -> str:
        if self.started:
            if self.after_tag:  # the newlines after the start tag may come in later deltas
                text = text.lstrip("\n")
                self.after_tag = not text
            return text
        self.pending += text
        head = self.pending.lstrip()
        tag = reasoning_start(self.end)
        if head.startswith(tag):
            self.pending = head[len(tag) :].lstrip("\n")
            self.after_tag = not self.pending
        elif tag.startswith(head) and not final:
            return ""  # may still become the start tag
        out, self.pending, self.started = self.pending, "", True
        return out

    def _content(self, text: str) -> str:
        if not self.content_started:
            text = text.lstrip("\n")
            self.content_started = bool(text)
        return text


def _partial_suffix(text: str, marker: str) -> int:
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0
