"""Constrained generation through Hugging Face ``transformers``: a ``LogitsProcessor`` over matchers.

Data flow of one ``model.generate`` step, per batch row ``r``::

    input_ids[r, -1]  (the token sampled last step)  -> matchers[r].accept_token
    matchers[r].fill_next_token_bitmask(bitmask.numpy(), r, remaining_tokens=...)
    formcast_kernels.apply_token_bitmask_inplace(scores, bitmask)     disallowed logits -> -inf
    -> transformers' temperature / top-k / top-p warpers -> sampling

``generate`` merges user processors *before* its sampling warpers, so the mask is applied to raw
logits and top-k/top-p only ever choose among allowed tokens.

Rows that finished (their matcher accepted EOS, or a token the grammar rejects slipped in, e.g.
a forced token from another processor) allow only the EOS and pad ids: ``generate`` keeps running
finished rows until the whole batch stops and replaces their tokens by the pad id, but their
scores must still hold a finite entry or sampling would see a row of ``-inf`` (NaN probabilities).

Beam search reorders rows between steps, which per-row matchers cannot follow: it is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from grammar import GrammarError, GrammarMatcher, TokenVocabulary, bitmask_width, pack_bool_mask
from grammar.caches import CACHES
from formcast_kernels import apply_token_bitmask_inplace

from ..constrained.grammar_backend import GrammarBackend
from ..sampling_params import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from grammar.compiler import CompiledGrammar


class FormcastLogitsProcessor(LogitsProcessor):
    """Masks each row's logits to the tokens its grammar allows next.

    ``grammars``: one ``CompiledGrammar`` shared by every row, or a sequence with one per row.
    ``batch_size``: number of rows (required with a single grammar unless it is 1; checked
    against the sequence length otherwise). ``max_new_tokens``: the generation budget; when
    given, each row only allows tokens after which its grammar can still be completed within the
    tokens left (budget-aware closing). ``pad_token_id``: also allowed on finished rows.

    The processor is stateful (one matcher per row). Calling it with a sequence that is not the
    previous one plus one token starts over (a new ``generate`` call): the first call of a
    generation sees the prompt and accepts nothing.
    """

    def __init__(
        self,
        grammars: "CompiledGrammar | Sequence[CompiledGrammar]",
        batch_size: int | None = None,
        *,
        max_new_tokens: int | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        grammars = _per_row(grammars, batch_size)
        vocab = grammars[0].vocab
        if any(g.vocab.fingerprint != vocab.fingerprint for g in grammars):
            raise ValueError("all grammars of a batch must be compiled against the same vocabulary")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.vocab: TokenVocabulary = vocab
        self.matchers = [GrammarMatcher(g) for g in grammars]
        self.max_new_tokens = max_new_tokens
        self.finish_ids = sorted(set(vocab.eos_token_ids) | ({int(pad_token_id)} if pad_token_id is not None else set()))
        # int32 [B, W]; the matchers write through the numpy view (no copy), the kernel reads it.
        self.bitmask = torch.zeros((len(grammars), bitmask_width(vocab.vocab_size)), dtype=torch.int32)
        self._bitmask_np = self.bitmask.numpy()
        self._finished_row = _finished_row(self.finish_ids, self.bitmask.shape[1])
        self._done = [False] * len(grammars)
        self._rejected = [False] * len(grammars)
        self.errors: list[str | None] = [None] * len(grammars)  # why a row was aborted
        self._seen_len: int | None = None  # input length at the previous call
        self._generated = 0

    @classmethod
    def from_sampling_params(
        cls,
        params: SamplingParams | dict | Sequence[SamplingParams | dict],
        vocab: TokenVocabulary,
        batch_size: int | None = None,
        **kwargs: Any,
    ) -> FormcastLogitsProcessor:
        """A processor for the constraint(s) in ``params`` (one for every row, or one per row),
        compiled by the same grammar backend as the Engine's: ``{"json_schema": ...}``,
        ``{"regex": ...}``, ``{"ebnf": ...}`` or ``{"structural_tag": ...}``."""
        rows = params if isinstance(params, Sequence) and not isinstance(params, (str, bytes)) else [params]
        grammars = [compile_for_params(p if isinstance(p, SamplingParams) else SamplingParams(**p), vocab) for p in rows]
        return cls(grammars if len(grammars) > 1 else grammars[0], batch_size, **kwargs)

    @property
    def batch_size(self) -> int:
        return len(self.matchers)

    def reset(self) -> None:
        """Forget everything accepted so far (a new generation)."""
        for m in self.matchers:
            m.reset()
        self._done = [False] * self.batch_size
        self._rejected = [False] * self.batch_size
        self.errors = [None] * self.batch_size
        self._seen_len = None
        self._generated = 0

    def rejected_rows(self) -> list[int]:
        """Rows that received a token their grammar did not allow (their output is not a match)."""
        return [r for r, bad in enumerate(self._rejected) if bad]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != self.batch_size:
            raise ValueError(
                f"the processor holds {self.batch_size} matchers but generate passed {input_ids.shape[0]} rows "
                "(beam search and num_return_sequences > 1 are not supported)"
            )
        length = input_ids.shape[1]
        if self._seen_len is not None and length == self._seen_len + 1:
            self._accept_last(input_ids[:, -1].tolist())
        else:
            self.reset()  # first call of a generation: input_ids is the prompt
        self._seen_len = length
        if scores.is_cuda and not self.bitmask.is_pinned():
            self._pin()
        self._fill()
        apply_token_bitmask_inplace(scores, self.bitmask, vocab_size=self.vocab.vocab_size)
        return scores

    def _pin(self) -> None:
        """Page-locked bitmask so the copy to the GPU logits' device is asynchronous. Refilling it
        next step is safe: ``generate`` reads the sampled ids back to the CPU in between, which
        waits for the stream that copied it."""
        self.bitmask = self.bitmask.pin_memory()
        self._bitmask_np = self.bitmask.numpy()

    def _accept_last(self, last: list[int]) -> None:
        self._generated += 1
        for row, token in enumerate(last):
            if self._done[row]:
                continue
            matcher = self.matchers[row]
            try:
                accepted = matcher.accept_token(token)
            except GrammarError as exc:  # a budget hit in one row must not stop the batch
                self._abort(row, exc)
                continue
            if not accepted:
                self._rejected[row] = True
                self._done[row] = True
            elif matcher.is_terminated():
                self._done[row] = True

    def _fill(self) -> None:
        remaining = None if self.max_new_tokens is None else max(1, self.max_new_tokens - self._generated)
        for row, matcher in enumerate(self.matchers):
            if not self._done[row]:
                try:
                    matcher.fill_next_token_bitmask(self._bitmask_np, row, remaining_tokens=remaining)
                    continue
                except GrammarError as exc:
                    self._abort(row, exc)
            self._bitmask_np[row] = self._finished_row

    def _abort(self, row: int, exc: Exception) -> None:
        """Finish ``row`` with its error (e.g. GrammarBudgetError); the other rows go on."""
        self.errors[row] = str(exc)
        self._rejected[row] = True
        self._done[row] = True


def _per_row(grammars: Any, batch_size: int | None) -> list["CompiledGrammar"]:
    if isinstance(grammars, Sequence) and not isinstance(grammars, (str, bytes)):
        rows = list(grammars)
        if not rows:
            raise ValueError("need at least one grammar")
        if batch_size is not None and batch_size != len(rows):
            raise ValueError(f"batch_size={batch_size} but {len(rows)} grammars were given")
        return rows
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [grammars] * (batch_size or 1)


def _finished_row(ids: Iterable[int], width: int) -> Any:
    """Packed row allowing only ``ids``."""
    allowed = np.zeros(32 * width, dtype=bool)
    allowed[[i for i in ids if 0 <= i < 32 * width]] = True
    return pack_bool_mask(allowed)


def compile_for_params(params: SamplingParams, vocab: TokenVocabulary) -> "CompiledGrammar":
    """The grammar of ``params`` through the engine's grammar backend (the one way a constraint
    is described, for the Engine, the server, the CLI and this processor alike)."""
    compiled = _backend_for(vocab).compile(params)
    if compiled is None:
        raise ValueError("the sampling parameters carry no constraint (json_schema, regex, ebnf or structural_tag)")
    return compiled


# One backend per vocabulary, emptied with the grammar caches (``grammar.clear_cache``).
_BACKENDS: dict[str, GrammarBackend] = CACHES.table("hf_grammar_backends", setup=True)


def _backend_for(vocab: TokenVocabulary) -> GrammarBackend:
    backend = _BACKENDS.get(vocab.fingerprint)
    if backend is None:
        backend = _BACKENDS.setdefault(vocab.fingerprint, GrammarBackend(vocab))
    return backend


def generate_constrained(
    model: Any,
    tokenizer: Any,
    prompts: str | Sequence[str],
    *,
    regex: str | None = None,
    json_schema: Any = None,
    ebnf: str | None = None,
    max_new_tokens: int = 64,
    chat: bool = True,
    do_sample: bool = False,
    vocab: TokenVocabulary | None = None,
    budget_aware: bool = True,
    **generate_kwargs: Any,
) -> list[str]:
    """Generate one completion per prompt under one constraint and return only the new text.

    Exactly one of ``regex`` (full match, ``re.ASCII`` semantics), ``json_schema`` (dict or JSON
    text) or ``ebnf`` applies to every prompt. ``chat=True`` wraps each prompt as a user turn with
    the tokenizer's chat template. Batches are left-padded. Generation stops at any EOS id of the
    vocabulary (``<|im_end|>``, ``<|endoftext|>``, ...). With ``budget_aware`` the grammar closes
    within ``max_new_tokens`` whenever it can. Extra keyword arguments go to ``model.generate``
    (``temperature``, ``top_p``, ...). A single prompt string still returns a list.
    """
    vocab = vocab if vocab is not None else TokenVocabulary.from_tokenizer(tokenizer)
    given = {k: v for k, v in (("regex", regex), ("json_schema", json_schema), ("ebnf", ebnf)) if v is not None}
    if len(given) != 1:
        raise ValueError(f"give exactly one of regex, json_schema, ebnf (got {sorted(given) or 'none'})")
    compiled = compile_for_params(SamplingParams(**given), vocab)
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    return generate_with_grammars(
        model, tokenizer, texts, [compiled] * len(texts), max_new_tokens=max_new_tokens, chat=chat,
        do_sample=do_sample, budget_aware=budget_aware, **generate_kwargs,
    )


def generate_with_grammars(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    grammars: "Sequence[CompiledGrammar]",
    *,
    max_new_tokens: int = 64,
    chat: bool = True,
    do_sample: bool = False,
    budget_aware: bool = True,
    **generate_kwargs: Any,
) -> list[str]:
    """Like :func:`generate_constrained` with one compiled grammar per prompt (one batch)."""
    if len(prompts) != len(grammars):
        raise ValueError(f"{len(prompts)} prompts but {len(grammars)} grammars")
    vocab = grammars[0].vocab
    texts = list(prompts)
    if chat:
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
            for t in texts
        ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(vocab.eos_token_ids)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # new tokens must line up at the right edge of every row
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat)
    finally:
        tokenizer.padding_side = side
    processor = FormcastLogitsProcessor(
        grammars, len(texts), max_new_tokens=max_new_tokens if budget_aware else None, pad_token_id=pad_id
    )
    with torch.inference_mode():
        out = model.generate(
            **enc,
            logits_processor=[processor],
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            eos_token_id=sorted(vocab.eos_token_ids),
            pad_token_id=pad_id,
            **generate_kwargs,
        )
    new = out[:, enc["input_ids"].shape[1] :]
    return [_decode_new(vocab, row.tolist()) for row in new]


def _decode_new(vocab: TokenVocabulary, ids: list[int]) -> str:
    """Text of the generated ids up to the first EOS, from the grammar's own byte table (the
    exact bytes the grammar constrained, independent of detokenizer clean-ups)."""
    out = []
    for t in ids:
        if t in vocab.eos_token_ids:
            break
        out.append(t)
    return vocab.decode_bytes(out).decode("utf-8", errors="replace")
