"""TensorRT-LLM 1.2's own checkpoint-loading rules, applied to a checkpoint's config and tensor
headers: what `PretrainedModel.from_checkpoint` -> `preprocess_weights` -> the quantized layers
accept, beyond the names, shapes and dtypes verify.py expects.

Read from NVIDIA/TensorRT-LLM's source, file@commit:
- `tensorrt_llm/models/modeling_utils.py@b35ac1b64368513d215c57d2ed01d62d910df8da` (version.py at that
  commit: 1.2.0rc2) `preprocess_perlayer_weights`: for W8A16 / W4A16 it calls
  `convert_utils.weight_only_quantize_dict` on every tensor;
- `tensorrt_llm/models/convert_utils.py@03961722f65265573cad179baca3bc5fe8c03f76` (the same function
  was first read at 9b3c712) `weight_only_quantize_dict`: a tensor is quantized when its
  NAME CONTAINS one of `WEIGHT_ONLY_NAME_PARTS` (a substring test, so
  `...qkv.weights_scaling_factor` matches `qkv.weight`), it is not int8, and no exclude pattern
  matches the tensor name (fnmatchcase; `exclude_modules` when given, else
  `*shared_expert_gate.weight`). The quantize op takes 2-D or 3-D float tensors only;
- `tensorrt_llm/quantization/quantize.py@06148676829d7f196219f0dc5bac74837c509c1d` `quantize_layers`:
  `exclude_modules`, when given and not empty (`quant_config.exclude_modules or [defaults]`), REPLACES `DEFAULT_EXCLUDE_MODULES`
  (fnmatchcase against each module's full name); weight-only quantization also replaces every
  `Embedding` by a `WeightOnlyQuantEmbedding` (int8 weight and a `per_token_scale` the checkpoint
  must then hold);
- `cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp@b35ac1b`
  `preprocess_weights_for_mixed_gemm`, which the quantize op runs on each [in, out] matrix of the
  rank: "Our kernels only handle dims which are multiples of 64 for weight-only quantization". Its
  checks (row permutation, `subbyte_transpose`'s 32-byte vectors, `interleave_column_major_tensor`'s
  64-row tiles) throw on the sm80 layout for int8 when the in features per rank are not a multiple
  of 64 or the out features not a multiple of 32; the sm90 layout was not read, so trtbuild asks
  for multiples of 64 on both sides everywhere, as the comment says. The layout is chosen by the
  GPU trtllm-build runs on (`getSMVersion()`), so the float checkpoint is the same for every SM.

The numbers themselves (scale and rounding) are emulated in trtbuild/checkpoint/trtllm_loadtime.py.

Plain data and strings: no torch."""

from __future__ import annotations

import fnmatch
from typing import Iterable, Optional

from trtbuild.facts.quantformats import QuantAlgo

# weight_only_quantize_dict's default `quant_weights` (convert_utils.py@9b3c712).
WEIGHT_ONLY_NAME_PARTS = ("qkv.weight", "dense.weight", "fc.weight", "proj.weight", "gate.weight")
# Its exclusion when exclude_modules is None.
WEIGHT_ONLY_DEFAULT_EXCLUDE = ("*shared_expert_gate.weight",)
# quantize_layers' exclusions when exclude_modules is None (quantize.py@0614867).
DEFAULT_EXCLUDE_MODULES = ("*lm_head", "*router", "*vocab_embedding", "*position_embedding", "*block_embedding",
                           "*shared_expert_gate", "*fused_a")
WEIGHT_ONLY_ALGOS = (QuantAlgo.W8A16, QuantAlgo.W4A16)
# The multiple every weight-only linear's in and out features per rank must be (cutlass_preprocessors.cpp).
WEIGHT_ONLY_DIM_MULTIPLE = 64
_FLOAT_CODES = ("F16", "BF16", "F32")
_INVALID_DIM = "'Invalid dim. The dim of weight should be 2 or 3'"


def excluded(module: str, exclude_modules: Optional[list]) -> bool:
    """quantize_layers' test: fnmatchcase of the module's full name against each pattern (the
    defaults when `exclude_modules` is None or empty). No ancestor walk, no `re:` patterns in 1.2."""
    patterns = exclude_modules or DEFAULT_EXCLUDE_MODULES
    return any(isinstance(p, str) and fnmatch.fnmatchcase(module, p) for p in patterns)


def weight_only_selects(name: str, exclude_modules: Optional[list]) -> bool:
    """Whether weight_only_quantize_dict quantizes the tensor `name` (before its int8 test): not
    excluded (fnmatchcase of the tensor name; `*shared_expert_gate.weight` when `exclude_modules`
    is None, nothing when it is empty) and containing one of WEIGHT_ONLY_NAME_PARTS."""
    patterns = WEIGHT_ONLY_DEFAULT_EXCLUDE if exclude_modules is None else exclude_modules
    if any(isinstance(p, str) and fnmatch.fnmatchcase(name, p) for p in patterns):
        return False
    return any(part in name for part in WEIGHT_ONLY_NAME_PARTS)


def exclusion_problems(quant: dict, unquantized_modules: Iterable[str]) -> list[str]:
    """The modules the checkpoint holds unquantized (the embedding, MoE routers) that TensorRT-LLM
    would replace by quantized layers because `exclude_modules` replaced its defaults."""
    algo, exclude = quant.get("quant_algo"), quant.get("exclude_modules")
    if algo is None or not exclude:  # None or []: quantize_layers keeps its defaults
        return []
    problems = []
    for module in unquantized_modules:
        is_embedding = module.endswith("vocab_embedding")
        if is_embedding and algo not in WEIGHT_ONLY_ALGOS:
            continue  # only weight-only quantization maps Embedding to a quantized layer
        if not excluded(module, exclude):
            becomes = ("a WeightOnlyQuantEmbedding (int8 weight and per_token_scale)" if is_embedding
                       else f"a {algo} linear")
            problems.append(
                f"config.json: quantization.exclude_modules {exclude} replaces TensorRT-LLM 1.2's default "
                f"exclusions and does not cover {module}: TensorRT-LLM would build it as {becomes}")
    return problems


def weight_only_problems(file: str, header: dict, quant: dict) -> dict[str, str]:
    """What weight_only_quantize_dict does to each tensor of a W8A16 / W4A16 rank file: the
    tensors it cannot load, each with the reason."""
    algo, exclude = quant.get("quant_algo"), quant.get("exclude_modules")
    if algo not in WEIGHT_ONLY_ALGOS:
        return {}
    problems = {}
    for name in sorted(header):
        info = header[name]
        if not isinstance(info, dict) or not weight_only_selects(name, exclude):
            continue
        dtype, shape = info.get("dtype"), list(info.get("shape", ()))
        part = next(p for p in WEIGHT_ONLY_NAME_PARTS if p in name)
        if dtype == "I8":
            problems[name] = (
                f"{file}: {name} is int8: TensorRT-LLM 1.2 quantizes {algo} weights itself at load, from float "
                f"weights, into its per-GPU layout; an int8 tensor is passed through unprocessed and gets no "
                f"per_channel_scale")
        elif len(shape) not in (2, 3):
            problems[name] = (
                f"{file}: {name} ({dtype} {shape}) contains {part!r}, so TensorRT-LLM 1.2's weight-only "
                f"preprocessing quantizes it, and its quantize op raises {_INVALID_DIM}")
        elif dtype not in _FLOAT_CODES:
            problems[name] = (
                f"{file}: {name} ({dtype} {shape}) contains {part!r}, so TensorRT-LLM 1.2's weight-only "
                f"preprocessing quantizes it as a float weight")
    return problems


def weight_only_dims_problem(algo: Optional[str], linears: dict[str, tuple[int, int]]) -> Optional[str]:
    """The first weight-only linear whose (out, in) features on one rank TensorRT-LLM's quantize op
    cannot lay out (None: all fit); `linears` maps a label to its per-rank (out, in)."""
    if algo not in WEIGHT_ONLY_ALGOS:
        return None
    m = WEIGHT_ONLY_DIM_MULTIPLE
    for label, (out, inp) in linears.items():
        for side, size in (("out", out), ("in", inp)):
            if size % m:
                return (f"{algo}: {label} has {size} {side} features per GPU; TensorRT-LLM 1.2 quantizes weight-only "
                        f"layers at load into a layout that needs multiples of {m} (cutlass_preprocessors.cpp)")
    return None
