"""Memory estimates from a model config alone: weights per GPU, KV cache per token, tokens that fit.

The model is TensorRT-LLM's checkpoint layout (reference/trtllm.md section 2): fused qkv and the
MLP are column/row-parallel over tp (KV heads duplicated when tp exceeds them), norms and the
vocab embedding are replicated, lm_head is vocab-padded and split over tp; pp splits the layers,
the embedding lives on the first stage and lm_head + final norm on the last. Quantized weights
carry their scales as ModelOpt exports them (reference/modelopt.md section 3); lm_head, the
embedding, the norms and a MoE router are never quantized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from trtbuild.facts.quantformats import FORMATS
from trtbuild.model.config import ModelSpec, padded_vocab

GIB = 1024**3
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
USABLE_FRACTION = 0.9  # share of GPU memory an estimate may plan for
RUNTIME_OVERHEAD = 1 * GIB  # CUDA context, cuBLAS and NCCL workspaces: measured runtimes sit near this


@dataclass(frozen=True)
class Estimate:
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int  # per GPU
    kv_tokens: Optional[int] = None  # tokens of KV cache that fit per GPU (engine targets)
    fits: Optional[bool] = None
    gpu_product: Optional[str] = None
    gpu_memory_bytes: Optional[int] = None
    activation_bytes: Optional[int] = None
    # Who chose gpu_product: "recipe" (the smallest card it names for the SM), "default" (the
    # recipe named only the SM: gpus.DEFAULT_PRODUCT), "option" (`--gpu PRODUCT`).
    gpu_chosen_by: Optional[str] = None

    def gpu_label(self) -> Optional[str]:
        """The card the estimate assumed, as the plan table shows it: `L4 (22.5 GiB)`."""
        if self.gpu_product is None:
            return None
        default = ", SM default" if self.gpu_chosen_by == "default" else ""
        return f"{self.gpu_product} ({format_bytes(self.gpu_memory_bytes or 0)}{default})"

    def as_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def linear_bytes(out_features: int, in_features: int, quant: Optional[str], dtype_bytes: int,
                 group_size: Optional[int] = None) -> float:
    """Bytes of one linear layer's weight plus its quantization scales, as exported; `group_size` of a
    per-group format (the variant's, else the format's default: quantformats.FORMATS)."""
    n = out_features * in_features
    if quant is None:
        return n * dtype_bytes
    if quant == "fp8":  # fp8 weight, per-tensor weight and activation scales
        return n + 8
    if quant == "int8_sq":  # int8 weight, per-channel weight scale, activation + prequant scales
        return n + out_features * 4 + 4 + in_features * 2
    if quant == "int8_wo":
        # TensorRT-LLM quantizes it at load: int8 weight + per_channel_scale [out] in the model dtype
        # (quantization/layers.py WeightOnlyQuantLinear; checkpoint/trtllm_loadtime.py)
        return n + out_features * dtype_bytes
    fmt = FORMATS.get(quant)
    if fmt is not None and fmt.grouped:  # packed int4, [out, in/group] f32 scales, prequant scale
        # (int4_wo is exported as W4A16_AWQ with a prequant scale of ones: quantformats.py)
        group = group_size or fmt.default_group_size
        return n / 2 + out_features * math.ceil(in_features / group) * 4 + in_features * 2 + 8
    if fmt is not None and fmt.block:  # nvfp4: packed fp4, one fp8 scale per block of elements, global scales
        return n / 2 + n / fmt.block + 8
    raise ValueError(f"unknown quantization {quant!r}")


def kv_bytes_per_element(kv_cache: Optional[str], dtype_bytes: int) -> float:
    if kv_cache in ("fp8", "int8"):
        return 1
    if kv_cache == "nvfp4":
        return 0.5 + 1 / 16
    return dtype_bytes


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    # KV heads are split over tp, or duplicated so that each rank holds one (reference section 2).
    return model.num_kv_heads // tp if model.num_kv_heads >= tp else 1


@dataclass(frozen=True)
class Tensor:
    """One weight of a decoder layer on one GPU: its component, shape, and whether it is quantized."""

    component: str  # attention | mlp | router | norm
    rows: int
    cols: int = 1
    quantizable: bool = True
    copies: int = 1  # MoE experts
    float32: bool = False


def layer_tensors(model: ModelSpec, tp: int) -> list[Tensor]:
    """A decoder layer's weights on one GPU of a tp group, in TensorRT-LLM's checkpoint layout."""
    hd, hidden = model.head_dim, model.hidden_size
    q_out = model.num_heads * hd // tp
    kv_out = kv_heads_per_gpu(model, tp) * hd
    inter = model.intermediate_size // tp
    experts = max(1, model.num_experts)
    tensors = [
        Tensor("attention", q_out + 2 * kv_out, hidden),  # attention.qkv (column)
        Tensor("attention", hidden, q_out),  # attention.dense (row)
        Tensor("mlp", inter, hidden, copies=experts),  # mlp.fc
        Tensor("mlp", hidden, inter, copies=experts),  # mlp.proj (row)
        Tensor("norm", 2 * hidden, quantizable=False),  # input_layernorm, post_layernorm
    ]
    if model.gated_mlp:
        tensors.append(Tensor("mlp", inter, hidden, copies=experts))  # mlp.gate
    if model.attention_bias:
        tensors.append(Tensor("attention", q_out + 2 * kv_out, quantizable=False))
    if model.num_experts:
        # "Router should never be quantized": float32 (reference/trtllm.md section 2)
        tensors.append(Tensor("router", model.num_experts, hidden, quantizable=False, float32=True))
    return tensors


def layer_weight_bytes(model: ModelSpec, tp: int, quant: Optional[str], dtype_bytes: int,
                       group_size: Optional[int] = None) -> float:
    total = 0.0
    for t in layer_tensors(model, tp):
        if t.float32:
            size = t.rows * t.cols * 4
        elif t.quantizable:
            size = linear_bytes(t.rows, t.cols, quant, dtype_bytes, group_size)
        else:
            size = t.rows * t.cols * dtype_bytes
        total += size * t.copies
    return total


def parameter_counts(model: ModelSpec) -> dict[str, int]:
    """Parameters per component of the Hugging Face model (tied embeddings counted once)."""
    counts = {"embedding": model.vocab_size * model.hidden_size, "attention": 0, "mlp": 0, "router": 0,
              "norm": model.hidden_size,
              "lm_head": 0 if model.tied_embeddings else model.vocab_size * model.hidden_size}
    for t in layer_tensors(model, 1):
        counts[t.component] += t.rows * t.cols * t.copies * model.num_layers
    counts["total"] = sum(counts.values())
    return counts


def weights_bytes_per_gpu(model: ModelSpec, tp: int, pp: int, quant: Optional[str], dtype: str,
                          group_size: Optional[int] = None, *, hf_layout: bool = False) -> int:
    """Bytes on the busiest GPU of a tp x pp engine (replicated parts counted on every GPU).

    TensorRT-LLM always stores lm_head, even when the model ties it to the embedding; a Hugging Face
    checkpoint (`hf_layout`) of a tied model stores it once."""
    dtype_bytes = DTYPE_BYTES[dtype]
    layers = math.ceil(model.num_layers / pp) * layer_weight_bytes(model, tp, quant, dtype_bytes, group_size)
    embedding = model.vocab_size * model.hidden_size * dtype_bytes
    lm_head_rows = 0 if (hf_layout and model.tied_embeddings) else padded_vocab(model.vocab_size, tp) // tp
    head = lm_head_rows * model.hidden_size * dtype_bytes + model.hidden_size * dtype_bytes
    ends = embedding + head if pp == 1 else max(embedding, head)
    return int(layers + ends)


def kv_bytes_per_token(model: ModelSpec, tp: int, pp: int, kv_cache: Optional[str], dtype: str) -> int:
    per_element = kv_bytes_per_element(kv_cache, DTYPE_BYTES[dtype])
    layers = math.ceil(model.num_layers / pp)
    return int(math.ceil(2 * layers * kv_heads_per_gpu(model, tp) * model.head_dim * per_element))


def activation_bytes(model: ModelSpec, tp: int, dtype: str, max_num_tokens: int, max_batch_size: int, max_beam_width: int) -> int:
    """A reserve for activations: one layer's live tensors for max_num_tokens tokens (TensorRT reuses
    activation memory across layers), the float32 logits of a full batch, and the runtime overhead."""
    act = DTYPE_BYTES[dtype]
    per_token = (4 * model.hidden_size + 3 * model.intermediate_size // tp) * act
    logits = max_batch_size * max_beam_width * padded_vocab(model.vocab_size, tp) // tp * 4
    return int(RUNTIME_OVERHEAD + max_num_tokens * per_token + logits)


def fit_on_gpu(weights: int, kv_per_token: int, activations: int, gpu_memory: int) -> tuple[bool, int]:
    """(weights and activations fit in USABLE_FRACTION of memory, KV tokens that fit in the rest)."""
    free = USABLE_FRACTION * gpu_memory - weights - activations
    return free >= 0, max(0, int(free // kv_per_token)) if kv_per_token else 0


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


# ---- what the host that runs trtllm-build needs ---------------------------------------------------

# What a trtllm-build worker holds beyond the model: the Python process with tensorrt_llm, torch and
# TensorRT loaded. A rule of thumb, not a measurement of every version.
BUILD_HOST_OVERHEAD = 4 * GIB


@dataclass(frozen=True)
class BuildNeeds:
    """What the build host needs for one engine target when `workers` ranks build at once."""

    host_ram_bytes: int  # all workers together
    gpu_bytes_per_worker: int
    workers: int

    def as_json(self) -> dict:
        return dict(self.__dict__)

    def label(self) -> str:
        """As the plan table shows it: `9.0 GiB RAM, 2.1 GiB/GPU x2` (x: workers, one GPU each)."""
        return f"{format_bytes(self.host_ram_bytes)} RAM, {format_bytes(self.gpu_bytes_per_worker)}/GPU x{self.workers}"


def build_memory_needs(plan, target, workers: Optional[int] = None) -> BuildNeeds:
    """Host RAM and GPU memory per worker that `trtllm-build` needs for an engine target.

    trtllm-build runs out of memory on large models when --workers and the build options do not
    suit the host (TensorRT-LLM issues #538, #1478, #2428), so the plan says what a build holds and
    the engine stage refuses early on a host with less. Per worker (one rank at a time):
    - host RAM: the rank's weights loaded and preprocessed in the checkpoint dtype (an upper bound
      for quantized formats, whose preprocessing works on full-precision copies), plus the engine
      being built and serialized (the rank's weights as the engine stores them), plus the process
      (BUILD_HOST_OVERHEAD);
    - GPU: the engine's weights, and TensorRT's activations and tactic workspace for max_num_tokens
      tokens with the batch's logits (`activation_bytes`, the runtime's reserve).
    `workers`: how many ranks build at once (default: all of them, the most a host may run).
    """
    model, tp, pp = plan.model, target.tp or 1, target.pp or 1
    workers = max(1, min(workers if workers is not None else tp * pp, tp * pp))
    variant = plan.recipe.variants[target.variant]
    limits = plan.recipe.limits
    engine_weights = weights_bytes_per_gpu(model, tp, pp, variant.quant, plan.dtype, variant.effective_group_size)
    dtype_weights = weights_bytes_per_gpu(model, tp, pp, None, plan.dtype)
    per_worker_ram = dtype_weights + engine_weights + BUILD_HOST_OVERHEAD
    gpu = engine_weights + activation_bytes(model, tp, plan.dtype, limits.max_num_tokens, limits.max_batch_size,
                                            limits.max_beam_width)
    return BuildNeeds(host_ram_bytes=int(workers * per_worker_ram), gpu_bytes_per_worker=int(gpu), workers=workers)


def gguf_bytes(model: ModelSpec, gguf_type: str) -> int:
    """Bytes of llama.cpp's GGUF of the model in `gguf_type`, as llama.cpp's quantizer picks each
    tensor's type (facts/quantformats.py): the layers' 2-D weights (and an untied embedding) in the
    type's ggml type, attn_v and ffn_down in the K mixes' more-bits type where use_more_bits says, a
    fallback where the block does not divide the input features; the output head (a tied embedding)
    in gguf_output_type; 1-D tensors in float32. The tokenizer and metadata are not counted."""
    from trtbuild.facts.quantformats import gguf_output_type, gguf_weight_type, use_more_bits

    kv_out = model.num_kv_heads * model.head_dim
    experts = max(1, model.num_experts)

    def weight(rows: int, cols: int, more_bits: bool = False) -> float:
        return rows * cols * gguf_weight_type(gguf_type, cols, more_bits).bytes_per_weight

    plain = sum((weight(t.rows, t.cols) if t.quantizable and t.cols > 1 else t.rows * t.cols * 4) * t.copies
                for t in layer_tensors(model, 1))
    # attn_v (kv_out x hidden) and ffn_down (hidden x intermediate) of a more-bits layer, replacing their plain share
    extra = (weight(kv_out, model.hidden_size, True) - weight(kv_out, model.hidden_size)
             + (weight(model.hidden_size, model.intermediate_size, True)
                - weight(model.hidden_size, model.intermediate_size)) * experts)
    layers = sum(plain + (extra if use_more_bits(i, model.num_layers) else 0) for i in range(model.num_layers))
    head = model.vocab_size * model.hidden_size * gguf_output_type(gguf_type, model.hidden_size).bytes_per_weight
    ends = head + (0 if model.tied_embeddings else weight(model.vocab_size, model.hidden_size)) + model.hidden_size * 4
    return int(layers + ends)
