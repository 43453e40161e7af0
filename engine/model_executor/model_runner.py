"""``ModelRunner``: owns the model, the KV memory and the sampler; runs ``ForwardBatch``es.

    runner = ModelRunner()                       # the embedded SmolLM2-135M-Instruct
    locs = runner.token_to_kv_pool.alloc(len(ids)); slot = runner.req_to_token_pool.alloc()[0]
    batch = ForwardBatch.init_new([ForwardInput(slot, 0, ids, locs)], runner.req_to_token_pool,
                                  runner.token_to_kv_pool, sampling_info=info)
    out = runner.forward(batch)                  # LogitsProcessorOutput
    tokens = runner.sample(out, batch)           # SamplerOutput (grammar mask, penalties, ...)

The KV pool is sized once, from ``max_total_tokens`` or from ``mem_fraction`` of the memory free
after the weights are loaded; ``max_running_requests`` sizes the request-slot pool. Everything
runs under ``torch.inference_mode``. The runner never sees a scheduler object: the batch is
tensors and lengths only.

On CUDA, decode steps of up to ``cuda_graph_max_bs`` rows (default: min(max_running_requests,
32); 0: off) replay CUDA graphs captured at the end of construction, when the model is eligible
(``cuda_graph_runner``); every other batch, and everything on the CPU, runs eagerly.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..layers import cpu_threads
from ..layers.attention import TorchAttention
from ..layers.ggml_quants import holds_quantized_weights
from ..layers.logits import LogitsProcessorOutput, compute_logits
from ..mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from ..models.llama import LlamaForCausalLM
from ..models.loader import is_gguf, load_config, load_model, resolve_dtype
from ..sampling.sampler import Sampler, SamplerOutput
from ..forward.forward_batch import ForwardBatch
from .cuda_graph_runner import CudaGraphRunner, graph_ineligibility

# Never size the KV pool below this many tokens, whatever mem_fraction says.
MIN_KV_TOKENS = 256
# Decode batches up to this many rows replay CUDA graphs unless cuda_graph_max_bs says otherwise.
DEFAULT_CUDA_GRAPH_MAX_BS = 32


class ModelRunner:
    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "cpu",
        max_total_tokens: int | None = None,
        mem_fraction: float = 0.2,
        max_running_requests: int = 64,
        context_length: int | None = None,
        num_threads: int | None = None,
        model: LlamaForCausalLM | None = None,
        quantization: str | None = None,
        cuda_graph_max_bs: int | None = None,
    ) -> None:
        """``model``: run this already-loaded model (e.g. a draft sharing the target's layers)
        instead of loading ``model_path``; ``dtype`` is then the model's. ``cuda_graph_max_bs``:
        the largest decode batch run in a CUDA graph (None: min(max_running_requests, 32); 0:
        no graphs; ignored off CUDA)."""
        if cuda_graph_max_bs is not None and cuda_graph_max_bs < 0:
            raise ValueError(f"cuda_graph_max_bs must be None or >= 0, got {cuda_graph_max_bs}")
        if not 0.0 < mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.device = torch.device(device)
        self.model_path = Path(model_path) if model_path is not None else _default_model_path()
        if model is not None:
            self.model, self.model_config = model, model.config
            self.dtype = model.norm.weight.dtype  # the activations' (a block-format embedding's is its kernels' float32)
        else:
            self.model_config = load_config(self.model_path)
            quantized = is_gguf(self.model_path) or quantization is not None
            self.dtype = resolve_dtype(dtype, self.device, quantized=quantized, declared=self.model_config.torch_dtype)
            self.model = load_model(self.model_path, self.dtype, self.device, quantization)
        self.context_len = self.model_config.context_len
        if context_length is not None:
            if context_length < 2:
                raise ValueError(f"context_length must be >= 2, got {context_length}")
            self.context_len = min(self.context_len, context_length)
        cfg = self.model_config
        per_token = TokenToKVPool.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype)
        if max_total_tokens is None:
            max_total_tokens = self._kv_tokens_from_memory(mem_fraction, per_token, max_running_requests)
        if max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {max_total_tokens}")
        self.max_total_tokens = max_total_tokens
        self.req_to_token_pool = ReqToTokenPool(max_running_requests, self.context_len, self.device)
        self.token_to_kv_pool = TokenToKVPool(
            max_total_tokens, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device
        )
        quantized = holds_quantized_weights(self.model)
        if quantized:
            self.model.use_row_kernels()
        self.attn_backend = TorchAttention(f16=cfg.ggml_numerics, every_query_alone=quantized)
        self.bind_threads()
        self.sampler = Sampler()
        self.cuda_graph_runner: CudaGraphRunner | None = None
        if self.device.type == "cuda" and cuda_graph_max_bs != 0 and graph_ineligibility(self) is None:
            max_bs = min(max_running_requests, DEFAULT_CUDA_GRAPH_MAX_BS) if cuda_graph_max_bs is None else cuda_graph_max_bs
            self.cuda_graph_runner = CudaGraphRunner(self, max_bs)
            self.cuda_graph_runner.capture()

    def bind_threads(self) -> None:
        """Give the calling thread the runner's thread count for the compiled loops: torch's count
        is the process's, numba's is per thread (a new thread gets numba's default, every core),
        so the thread that runs the forwards, and the one that compiles their kernels, call this
        first."""
        cpu_threads.set_threads(torch.get_num_threads())

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def _kv_tokens_from_memory(self, fraction: float, per_token: int, max_requests: int) -> int:
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0]
        else:
            import psutil

            free = psutil.virtual_memory().available
        tokens = int(free * fraction) // per_token
        return max(MIN_KV_TOKENS, min(tokens, max_requests * self.context_len))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        graphs = self.cuda_graph_runner
        if graphs is not None and graphs.can_run(batch):
            return graphs.replay(batch)
        batch.attn_metadata = self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch, self.attn_backend)
        return compute_logits(hidden, self.model.lm_head, batch, self.model_config.final_softcap)

    @torch.inference_mode()
    def sample(self, output: LogitsProcessorOutput, batch: ForwardBatch) -> SamplerOutput:
        """The sampling step: grammar bitmask, penalties, temperature / top-k / top-p / min-p,
        seeds, logprobs (``batch.sampling_info`` says which), one token per virtual row of
        ``batch.row_layout`` (rows still mid-prefill sample nothing). A batch with drafts is
        verified instead (``speculative.worker``), from the same rows: ``sampling_logits``."""
        assert batch.sampling_info is not None, "sampling needs the batch's SamplingBatchInfo"
        return self.sampler.sample(self.sampling_logits(output, batch), batch.sampling_info)

    @staticmethod
    def sampling_logits(output: LogitsProcessorOutput, batch: ForwardBatch) -> torch.Tensor:
        """The logits of the batch's virtual sampling rows, in ``sampling_info`` order."""
        logits = output.next_token_logits
        return logits if batch.row_layout is None else batch.row_layout.sampling_logits(logits)


def _default_model_path() -> Path:
    from ..hf.model_files import default_model_path

    return default_model_path()
