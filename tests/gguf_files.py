"""Tiny random Llama-shaped models written by the tests, as a Hugging Face folder and as GGUF files.

``write_tiny_pair(folder)`` saves a random transformers Llama (hidden 256, so every block format
including the 256-element K-quants divides its rows) and writes the same weights into
``folder/model-F32.gguf`` the way llama.cpp's converter does (GGUF tensor names, q/k rows permuted
for its interleaved RoPE, a byte-level tokenizer of 256 byte tokens, two specials and one merge).
``quantize(src, dst, type_name, state)`` re-encodes a GGUF's matrices: with llama.cpp's own quantizer when
``llama_cpp`` is importable (``pure``: every matrix in that type), else with ``gguf.quants``
(which quantizes the 32-element block types only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

TINY = dict(
    vocab_size=259, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False, initializer_range=0.05, bos_token_id=256, eos_token_id=257,
)  # fmt: skip
SPECIALS = ("<|im_start|>", "<|im_end|>")


def byte_level_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value (printable Latin-1 bytes stand for
    themselves; the others map to code points from 256 upwards, in byte order)."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order for q / k rows (pairs interleaved within each head)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_pair(folder: Path, seed: int = 0) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(HF folder, F32 GGUF path, the weights by transformers name) holding the same random weights."""
    import transformers as tf

    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY)).eval()
    with torch.no_grad():  # random init leaves the norms at one: make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    hf_dir = folder / "hf"
    model.save_pretrained(str(hf_dir))
    path = folder / "model-F32.gguf"
    state = tiny_state(model)
    write_gguf(path, state)
    return hf_dir, path, state


def tiny_state(model) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    return {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}


def write_gguf(path: Path, state: dict[str, np.ndarray], qtype: str | None = None, pre: str = "default", config: dict | None = None) -> None:  # type: ignore[type-arg]
    """``state``: transformers names -> float32 arrays; ``qtype``: encode the matrices with
    ``gguf.quants`` (embeddings and head included), else F32. ``config``: the shape (``TINY``'s
    keys; the tokenizer is always the tiny one, so its vocabulary size stays ``TINY``'s)."""
    import gguf

    c = config or TINY
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("formcast-tiny")
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(c["hidden_size"] // heads)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_vocab_size(c["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_tiny_tokenizer(w, pre)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}  # fmt: skip
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    }  # fmt: skip
    for name, value in state.items():
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            target = f"blk.{i}.{per_layer[rest]}"
            if rest.startswith("self_attn.q_proj"):
                value = _permute(value, heads)
            elif rest.startswith("self_attn.k_proj"):
                value = _permute(value, kv_heads)
        else:
            target = names[name]
        value = np.ascontiguousarray(value, dtype=np.float32)
        if qtype is not None and value.ndim == 2:
            kind = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(target, gguf.quants.quantize(value, kind), raw_dtype=kind)
        else:
            w.add_tensor(target, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_tiny_tokenizer(w, pre: str = "default") -> None:  # type: ignore[no-untyped-def]
    """The byte-level tokenizer of the tiny files (259 tokens: 256 bytes, two specials, one merge)."""
    import gguf

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    # llama.cpp refuses a byte-level vocabulary without merges: one merge, " t", and its token
    w.add_token_list(byte_level_chars() + list(SPECIALS) + ["\u0120t"])
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL])
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(TINY["bos_token_id"])
    w.add_eos_token_id(TINY["eos_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")


def llama_cpp_module():
    try:
        import llama_cpp
    except ImportError:
        return None
    return llama_cpp


def quantize(src: Path, dst: Path, type_name: str, state: dict[str, np.ndarray]) -> str:
    """Re-encode ``src``'s matrices (``state``: its weights) as ``type_name`` into ``dst``;
    returns which quantizer ran."""
    llama_cpp = llama_cpp_module()
    if llama_cpp is not None:
        params = llama_cpp.llama_model_quantize_default_params()
        # the K-quant file types are mixes; with ``pure`` their base type covers every matrix
        ftype = {"Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}.get(type_name, type_name)
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
        params.pure = True
        params.nthread = 2
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
        assert rc == 0, f"llama_model_quantize failed ({rc})"
        return "llama.cpp"
    write_gguf(dst, state, qtype=type_name)
    return "gguf.quants"
