"""Published model shapes, in Megatron-LM's argument names, to start a model from
(`model: {preset: llama-3-8b}`; `architecture:` keys beside it override the preset's).

- The Zero Bubble paper's GPT models (Qi et al. 2024, Table 3: layers, heads, hidden size,
  sequence length 1024, microbatch size; h and a are the ones `zbopt.core.paper_tables` ships with the
  Table 9 times). The paper does not state the vocabulary: GPT-2's 50,257 tokens padded to a
  multiple of 128 as Megatron-LM does, 50,304, is assumed. Its Table 1 counts the attention
  scores' memory (5as²b), so these presets have flash attention off.
- Llama 3 8B and 70B (Meta, "The Llama 3 Herd of Models", 2024, Table 3, and the released
  configs): SwiGLU, RMSNorm, rotary positions, no linear biases, untied embeddings, 8 KV heads,
  vocabulary 128,256, sequence 8,192.
- Llama 2 7B (Touvron et al. 2023): as Llama 3 but 32 KV heads, ffn 11,008, vocabulary 32,000,
  sequence 4,096.
"""

from __future__ import annotations

from zbopt.core.errors import ZboptError, shorten
from zbopt.core.paper_tables import SEQUENCE_LENGTH, ZERO_BUBBLE_MODELS

__all__ = ["GPT2_PADDED_VOCABULARY", "PRESETS", "preset"]

GPT2_PADDED_VOCABULARY = 50304
# ZB Table 3: model -> (layers, microbatch size); h and a from zbopt.core.paper_tables.
_ZERO_BUBBLE_SHAPES = {"1.5B": (22, 6), "6.2B": (30, 3), "14.6B": (46, 1), "28.3B": (62, 1)}
_LLAMA = dict(swiglu=True, normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False,
              untie_embeddings_and_output_weights=True, flash_attention=True, micro_batch_size=1)


def _zero_bubble(name: str) -> dict:
    layers, micro_batch = _ZERO_BUBBLE_SHAPES[name]
    model = ZERO_BUBBLE_MODELS[name]
    return dict(num_layers=layers, hidden_size=model.hidden, num_attention_heads=model.heads,
                seq_length=SEQUENCE_LENGTH, micro_batch_size=micro_batch, vocab_size=GPT2_PADDED_VOCABULARY,
                flash_attention=False)


PRESETS: dict[str, dict] = {
    **{f"zb-{name.lower()}": _zero_bubble(name) for name in _ZERO_BUBBLE_SHAPES},
    "llama-2-7b": dict(_LLAMA, num_layers=32, hidden_size=4096, ffn_hidden_size=11008, num_attention_heads=32,
                       num_query_groups=32, seq_length=4096, vocab_size=32000),
    "llama-3-8b": dict(_LLAMA, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                       num_query_groups=8, seq_length=8192, vocab_size=128256),
    "llama-3-70b": dict(_LLAMA, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                        num_query_groups=8, seq_length=8192, vocab_size=128256),
}


def preset(name: object, key: str = "preset") -> dict:
    """The Megatron-LM arguments of preset `name` (a copy to change freely)."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ZboptError(f"{key} = {shorten(name)}: unknown preset (known: {', '.join(PRESETS)})")
    return dict(PRESETS[name])
