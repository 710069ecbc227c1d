"""A decoder-only transformer's shape, in Megatron-LM's argument names (`--num-layers` ->
`num_layers`), so that a training script's arguments can be copied in as they are.

Only the shape lives here; `zbopt.planning.model.flops` turns it into per-layer times and bytes.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from zbopt.core.errors import ZboptError, shorten
from zbopt.planning.model.parts import check_repeat

__all__ = ["NORMALIZATIONS", "POSITION_EMBEDDINGS", "Architecture"]

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDINGS = ("learned_absolute", "rope", "none")


@dataclass(frozen=True)
class Architecture:
    """The shape of a GPT-like model (Megatron-LM's names and, where it has one, its default).

    `ffn_hidden_size` defaults as in Megatron-LM: 4h, or with `swiglu` int(8h/3 / 64)·64 (the
    same weights as a 4h GeLU MLP, rounded down to a multiple of 64); `num_query_groups` defaults
    to `num_attention_heads` (no grouped-query attention). `vocab_size` is taken as given: pad it
    as your run does (Megatron-LM pads to a multiple of 128 × tensor-parallel size).
    `flash_attention` (zbopt's name; Megatron-LM's `--use-flash-attn`) is on by default.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    vocab_size: int
    micro_batch_size: int = 1
    ffn_hidden_size: int | None = None
    num_query_groups: int | None = None
    swiglu: bool = False
    untie_embeddings_and_output_weights: bool = False
    flash_attention: bool = True
    normalization: str = "LayerNorm"
    add_bias_linear: bool = True
    position_embedding_type: str = "learned_absolute"

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            whole = field.type == "int" or (field.type == "int | None" and value is not None)
            if whole and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ZboptError(f"{field.name} = {shorten(value)}: expected a positive whole number")
            if field.type == "bool" and not isinstance(value, bool):
                raise ZboptError(f"{field.name} = {shorten(value)}: expected true or false")
        check_repeat(self.num_layers, "num_layers")  # each becomes a layer of the model: the same cap
        for name, choices in (("normalization", NORMALIZATIONS), ("position_embedding_type", POSITION_EMBEDDINGS)):
            if getattr(self, name) not in choices:
                raise ZboptError(f"{name} = {shorten(getattr(self, name))}: expected one of {', '.join(choices)}")
        if self.hidden_size % self.num_attention_heads:
            raise ZboptError(f"num_attention_heads = {self.num_attention_heads}: does not divide hidden_size "
                             f"{self.hidden_size}")
        if self.num_query_groups is None:
            object.__setattr__(self, "num_query_groups", self.num_attention_heads)
        if self.num_attention_heads % self.num_query_groups:
            raise ZboptError(f"num_query_groups = {self.num_query_groups}: does not divide num_attention_heads "
                             f"{self.num_attention_heads}")
        if self.ffn_hidden_size is None:
            ffn = int(8 * self.hidden_size / 3 / 64) * 64 if self.swiglu else 4 * self.hidden_size
            object.__setattr__(self, "ffn_hidden_size", ffn)

    @classmethod
    def from_config(cls, section: object, where: str = "architecture", base: dict | None = None) -> Architecture:
        """The `architecture:` mapping; keys given override `base` (a preset's), none is dropped."""
        if not isinstance(section, dict):
            raise ZboptError(f"{where} = {shorten(section)}: expected a mapping of Megatron-LM argument names")
        known = [field.name for field in fields(cls)]
        unknown = [key for key in section if key not in known]
        if unknown:
            raise ZboptError(f"{where}: unknown key {shorten(unknown[0])} (known: {', '.join(known)})")
        values = {**(base or {}), **section}
        required = [field.name for field in fields(cls) if field.default is MISSING]
        missing = [name for name in required if name not in values]
        if missing:
            raise ZboptError(f"{where}: missing key {missing[0]} (required: {', '.join(required)})")
        try:
            return cls(**values)
        except ZboptError as error:
            raise ZboptError(f"{where}.{error}") from None

    @property
    def head_size(self) -> int:
        """h / a, the size of one attention head (Megatron-LM's `kv_channels` default)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_size(self) -> int:
        """The width of K (and of V): one head per query group."""
        return self.head_size * self.num_query_groups
