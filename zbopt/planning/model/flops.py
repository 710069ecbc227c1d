"""Per-layer costs from an architecture: FLOPs -> time at the device's sustained FLOP/s, bytes of
activations (Korthikanti et al. 2022) and of parameters with their optimizer state.

Notation (one microbatch): b micro_batch_size, s seq_length, h hidden_size, a attention heads,
g query groups, f ffn_hidden_size, V vocab_size, e bytes per activation element (2 in bf16/fp16).
A matmul of (m×k)·(k×n) costs 2mkn FLOPs. F runs the layer's matmuls; B the matmuls that give
the input's gradient and the attention core's backward; W the matmuls that give the weights'
gradients (the split of "Zero Bubble Pipeline Parallelism", Qi et al. 2024, Table 1). Elementwise
work (norms, activations, softmax, the loss) is not counted: a few FLOPs per element against 2h
per element of a matmul.
"""

from __future__ import annotations

from dataclasses import dataclass

from zbopt.core.errors import ZboptError, shorten
from zbopt.planning.model.architecture import Architecture
from zbopt.planning.model.parts import Device, Layer

__all__ = ["DEFAULT_TRAINING", "ELEMENT_BYTES", "LOGIT_BYTES", "MASK_BYTES", "PARAMETER_BYTES", "Costs", "Training",
           "architecture_layers", "decoder_costs", "decoder_parameters", "embedding_costs", "lm_head_costs"]

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Bytes per parameter of mixed-precision Adam in Megatron-LM (its distributed-optimizer guide):
# (kept whole on every rank, shardable optimizer part). bf16: 2 weight + 4 fp32 main gradient, then
# 4 fp32 master weight + 4 m + 4 v = 18; fp16: 2 + 2 fp16 gradient, then 16 = 20; fp32: 4 + 4, 8 = 16.
PARAMETER_BYTES = {"bf16": (6, 12), "fp16": (4, 16), "fp32": (8, 8)}
MASK_BYTES = 1  # a dropout mask keeps one byte per element (Korthikanti et al. 2022)
LOGIT_BYTES = 4  # the loss reads fp32 logits (ibid., the output layer's 4sbV)


@dataclass(frozen=True)
class Training:
    """How the model is trained, as far as memory goes: `dtype` of weights and activations, and
    whether Adam's state is sharded over `data_parallel` ranks (Megatron-LM's
    `--use-distributed-optimizer`, ZeRO stage 1), or everything is (`fsdp`: weights, gradients and
    state sharded, each stage's weights gathered before its first forward, as torch's FSDP2 with
    pipelining keeps them until the stage's backward is done)."""

    dtype: str = "bf16"
    data_parallel: int = 1
    use_distributed_optimizer: bool = False
    fsdp: bool = False

    def __post_init__(self):
        if self.dtype not in ELEMENT_BYTES:
            raise ZboptError(f"dtype = {shorten(self.dtype)}: expected one of {', '.join(ELEMENT_BYTES)}")
        if isinstance(self.data_parallel, bool) or not isinstance(self.data_parallel, int) or self.data_parallel < 1:
            raise ZboptError(f"data_parallel = {shorten(self.data_parallel)}: expected a positive whole number")
        for key in ("use_distributed_optimizer", "fsdp"):
            if not isinstance(getattr(self, key), bool):
                raise ZboptError(f"{key} = {shorten(getattr(self, key))}: expected true or false")
        if self.fsdp and self.use_distributed_optimizer:
            raise ZboptError("fsdp = true: it shards the optimizer's state as well; give fsdp or "
                             "use_distributed_optimizer, not both")

    @property
    def sharded(self) -> bool:
        """Whether each rank updates only its shard of the optimizer's state (ZeRO-1 or FSDP), its
        gradients reduce-scattered."""
        return self.use_distributed_optimizer or self.fsdp

    @property
    def bytes_per_parameter(self) -> float:
        """18 for bf16 (2 + 4 + 12); with the distributed optimizer 6 + 12/d, d = data_parallel;
        with FSDP 18/d (the gathered weights count apart, as the Problem's unshard_memory)."""
        whole, shardable = PARAMETER_BYTES[self.dtype]
        if self.fsdp:
            return (whole + shardable) / self.data_parallel
        return whole + shardable / (self.data_parallel if self.use_distributed_optimizer else 1)

    @property
    def gradient_bytes(self) -> int:
        """Bytes per parameter of the gradient a data-parallel reduction moves: the kept-whole part
        less the weight (bf16: the fp32 main gradient, 4; fp16: 2; fp32: 4)."""
        return PARAMETER_BYTES[self.dtype][0] - ELEMENT_BYTES[self.dtype]

    @property
    def step_bytes(self) -> float:
        """Bytes per parameter a fused Adam step moves: it reads the gradient and the optimizer's
        part (master weight, m, v), writes that part back and the weight (bf16: 4 + 12 + 12 + 2 =
        30); with the distributed optimizer or FSDP each rank updates its 1/d shard."""
        moved = self.gradient_bytes + 2 * PARAMETER_BYTES[self.dtype][1] + ELEMENT_BYTES[self.dtype]
        return moved / (self.data_parallel if self.sharded else 1)


DEFAULT_TRAINING = Training()  # bf16, one data-parallel rank: what a model without training keys is


@dataclass(frozen=True)
class Costs:
    """One layer's raw counts per microbatch: FLOPs of F, B, W; bytes M_B, M_W; parameters."""

    forward: float
    backward: float
    weight: float
    activation: float
    weight_activation: float
    parameters: float


def decoder_costs(arch: Architecture, dtype: str) -> Costs:
    """One transformer layer.

    Matmul FLOPs of F (and equally of B's input gradients and of W's weight gradients):
    2bsh·(h + 2hg/a) for Q, K, V, 2bsh² for the output projection, 2bsh·f·2 for the MLP (·3 with
    SwiGLU's gate). With a = g, f = 4h that is 24bsh² (ZB Table 1). The attention core, QKᵀ and
    its product with V: 4bs²h in F; 8bs²h in B (two gradients of each), 10bs²h with flash
    attention, whose backward recomputes QKᵀ (FlashAttention-2: 5 matmuls to the forward's 2).

    Activations (Korthikanti et al. 2022, sbh(34 + 5as/h) bytes with a = g, f = 4h, e = 2):
    e·sbh per stored h-wide tensor (two norm inputs, the QKV input, Q, the output projection's
    input, the MLP input) plus e·sbh·2g/a for K and V, e·sbf twice for the MLP activation's input
    and output (three times with SwiGLU: gate, up, product), two 1-byte dropout masks (2sbh),
    and without flash attention the scores, their dropout mask and its output: (2e + 1)·as²b.
    M_W is M_B less what only B reads, the masks and the scores: 32sbh as in ZB Table 1.
    """
    b, s, h, a = arch.micro_batch_size, arch.seq_length, arch.hidden_size, arch.num_attention_heads
    f, e = arch.ffn_hidden_size, ELEMENT_BYTES[dtype]
    mlp = 3 if arch.swiglu else 2
    matmuls = 2 * b * s * h * (h + 2 * arch.kv_size) + 2 * b * s * h * h + 2 * b * s * h * f * mlp
    core_backward = 10 if arch.flash_attention else 8
    tensors = e * s * b * (6 * h + 2 * arch.kv_size) + e * s * b * f * mlp
    masks = 2 * MASK_BYTES * s * b * h
    scores = 0 if arch.flash_attention else (2 * e + MASK_BYTES) * a * s * s * b
    return Costs(forward=matmuls + 4 * b * s * s * h, backward=matmuls + core_backward * b * s * s * h,
                 weight=matmuls, activation=tensors + masks + scores, weight_activation=tensors,
                 parameters=decoder_parameters(arch))


def decoder_parameters(arch: Architecture) -> int:
    """Weights of one layer: h(h + 2hg/a) + h² + (2 or 3)hf, biases (h + 2hg/a) + h + (f or 2f) + h
    when `add_bias_linear`, two norms of 2h (LayerNorm) or h (RMSNorm): 12h² + 13h for GPT."""
    h, f = arch.hidden_size, arch.ffn_hidden_size
    qkv = h + 2 * arch.kv_size
    weights = h * qkv + h * h + (3 if arch.swiglu else 2) * h * f
    biases = qkv + h + (2 * f if arch.swiglu else f) + h if arch.add_bias_linear else 0
    return weights + biases + 2 * _norm_parameters(arch)


def embedding_costs(arch: Architecture) -> Costs:
    """The input embedding: a lookup, no matmul. F copies bsh elements, W scatter-adds bsh
    gradient elements into the table (counted as one operation each: memory-bound, a token of
    time); B has nothing to do (token ids have no gradient). M_B: the embedding dropout's mask,
    sbh bytes (Korthikanti et al. 2022); M_W 0. Parameters: Vh, plus sh learned positions."""
    b, s, h = arch.micro_batch_size, arch.seq_length, arch.hidden_size
    positions = s * h if arch.position_embedding_type == "learned_absolute" else 0
    return Costs(forward=b * s * h, backward=0.0, weight=b * s * h, activation=MASK_BYTES * s * b * h,
                 weight_activation=0.0, parameters=arch.vocab_size * h + positions)


def lm_head_costs(arch: Architecture, dtype: str) -> Costs:
    """The final norm, the output projection (h × V) and the loss. F, B and W each 2bshV (the
    projection, its input gradient, its weight gradient). M_B: the norm's and the projection's
    inputs, 2e·sbh, and the fp32 logits the loss reads, 4sbV (Korthikanti et al. 2022: 4sbh + 4sbV
    in bf16). M_W: B frees the fp32 logits but keeps their gradient, e·sbV, for W: 2e·sbh + e·sbV.
    Parameters: Vh and the norm. With tied embeddings Megatron-LM keeps a copy of the word
    embedding on the last stage (its gradient all-reduced with the first's), so the head holds Vh
    either way."""
    b, s, h, vocab, e = arch.micro_batch_size, arch.seq_length, arch.hidden_size, arch.vocab_size, \
        ELEMENT_BYTES[dtype]
    projection = 2 * b * s * h * vocab
    return Costs(forward=projection, backward=projection, weight=projection,
                 activation=2 * e * s * b * h + LOGIT_BYTES * s * b * vocab,
                 weight_activation=2 * e * s * b * h + e * s * b * vocab,
                 parameters=vocab * h + _norm_parameters(arch))


def _norm_parameters(arch: Architecture) -> int:
    return (2 if arch.normalization == "LayerNorm" else 1) * arch.hidden_size


def architecture_layers(arch: Architecture, device: Device, training: Training) -> list[tuple[Layer, int]]:
    """(layer, repeat) in model order: embedding, decoder × num_layers, lm_head; times at the
    device's FLOP/s, bytes in GB (10^9)."""
    if device.flops is None:
        raise ZboptError("device.flops: missing; costs from an architecture need the device's sustained "
                         "FLOP/s, e.g. flops: 400 TFLOPS")
    parts = (("embedding", embedding_costs(arch), 1), ("decoder", decoder_costs(arch, training.dtype), arch.num_layers),
             ("lm_head", lm_head_costs(arch, training.dtype), 1))
    try:
        return [(_layer(name, costs, device.flops, training), repeat) for name, costs, repeat in parts]
    except ZboptError as error:  # a cost out of range: the architecture's size or the device's rate
        raise ZboptError(f"{error}, from the architecture at device.flops = {device.flops:g} FLOP/s") from None


def _layer(name: str, costs: Costs, flops: float, training: Training) -> Layer:
    def milliseconds(count: float) -> float:
        return count / flops * 1e3

    return Layer(name=name, forward_ms=milliseconds(costs.forward), backward_ms=milliseconds(costs.backward),
                 weight_ms=milliseconds(costs.weight), activation_gb=costs.activation / 1e9,
                 weight_activation_gb=costs.weight_activation / 1e9,
                 parameters_gb=costs.parameters * training.bytes_per_parameter / 1e9,
                 gradient_gb=costs.parameters * training.gradient_bytes / 1e9)
