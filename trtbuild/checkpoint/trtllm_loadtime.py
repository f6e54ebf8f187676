"""TensorRT-LLM 1.2's load-time weight-only quantization, emulated in torch for validation.

A W8A16 (or W4A16) TensorRT-LLM checkpoint holds float weights; TensorRT-LLM quantizes them when
`PretrainedModel.from_checkpoint` calls `preprocess_weights` (trtllm-build does, on the GPU it
builds on). Validation reads the checkpoint back through this module, so the torch runner computes
with the weights the engine holds, not with the floats on disk. The path followed, as read:

- `tensorrt_llm/models/modeling_utils.py@b35ac1b64368513d215c57d2ed01d62d910df8da` (version.py
  1.2.0rc2): `preprocess_weights` groups the tensors by layer and `preprocess_perlayer_weights`
  sends every group of a W8A16 / W4A16 checkpoint to `weight_only_quantize_dict`;
- `tensorrt_llm/models/convert_utils.py@03961722f65265573cad179baca3bc5fe8c03f76`:
  `weight_only_quantize_dict` picks the tensors (trtllm_load_rules.weight_only_selects: name
  contains `qkv.weight`, `dense.weight`, `fc.weight`, `proj.weight` or `gate.weight`, not int8,
  not excluded) and `weight_only_quantize` transposes each [out, in] weight to [in, out]
  (`weight.t()`, or `transpose(-1, -2)` for a 3-D stack of experts) and calls
  `torch.ops.trtllm.symmetric_quantize_last_axis_of_batched_matrix(v.contiguous(), int8 | quint4x2)`;
  the weight becomes the processed int8 tensor and `<name minus .weight>.per_channel_scale` the scales;
- `cpp/tensorrt_llm/thop/weightOnlyQuantOp.cpp@23bc5b7c490576071a021d6fcfc32c5808db36a2`
  `symmetric_quantize_helper`: 2-D or 3-D float32/float16/bfloat16 only ("Invalid dim. The dim of
  weight should be 2 or 3"); the scales are a tensor of the WEIGHT's dtype, one per column of the
  last axis (so per output channel), computed by `symmetric_quantize<T, T>`;
- `cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_preprocessors.cpp@b35ac1b64368513d215c57d2ed01d62d910df8da`
  `symmetric_quantize`: per column, in float32, `max = max_rows |float(w)|`, then
  `max *= 1.f / (1 << (bits - 1))` (1/128 for int8, 1/8 for int4) and the stored scale is
  `T(max)`; each element is `round(float(w) / max)` (C `round`: half away from zero; 0 where
  max is 0) clipped to [-128, 127] (int8) or, after `int(...)`, to [-8, 7] (int4). The values
  are then only re-laid out for the GEMM (`preprocess_weights_for_mixed_gemm`), not changed.
- `tensorrt_llm/quantization/layers.py@027cd518e3b63809a5c5799187991e7f1164fb12`
  `WeightOnlyQuantLinear` / `WeightOnlyQuantRowLinear`: `per_channel_scale` of shape
  [out features per rank] in the model dtype, multiplied back in by `weight_only_quant_matmul`.

What the engine multiplies with is taken to be int value x scale, rounded once to the model dtype
(both factors are exact in float32, so their product is too). The GEMM's own arithmetic (where it
applies the scale, its accumulation order) is a kernel's and is not emulated: torch computes with
these dequantized weights like with any other. Quantization happens per rank, on the rank's slice:
a row-parallel layer's channels take their maximum over that rank's input features only.
"""

from __future__ import annotations

from typing import Optional

from trtbuild.checkpoint.trtllm_load_rules import WEIGHT_ONLY_ALGOS, weight_only_selects
from trtbuild.errors import TrtbuildError
from trtbuild.facts.quantformats import QuantAlgo

BITS = {QuantAlgo.W8A16: 8, QuantAlgo.W4A16: 4}


def symmetric_quantize_last_axis(weight, bits: int):
    """(int values as int8, scales in the weight's dtype) of a 2-D [rows, cols] or 3-D [E, rows, cols]
    float weight, one scale per column of the last axis, as `symmetric_quantize` computes them."""
    import torch

    if weight.dim() not in (2, 3):
        raise TrtbuildError("TensorRT-LLM's weight-only quantize op: 'Invalid dim. The dim of weight should be 2 or 3'")
    if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TrtbuildError(f"TensorRT-LLM's weight-only quantize op takes float32/float16/bfloat16, not {weight.dtype}")
    w = weight.to(torch.float32)
    col_max = w.abs().amax(dim=-2, keepdim=True)  # per column of each matrix: over its rows
    col_max = col_max * torch.tensor(1.0 / (1 << (bits - 1)), dtype=torch.float32)  # a power of two: exact
    ratio = torch.where(col_max != 0, w / torch.where(col_max != 0, col_max, 1.0), torch.zeros_like(w))
    # C round(): half away from zero. |ratio| <= 2**(bits-1), so ratio - trunc(ratio) is exact.
    whole = torch.trunc(ratio)
    rounded = whole + torch.sign(ratio) * ((ratio - whole).abs() >= 0.5).to(torch.float32)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    values = rounded.clamp(low, high).to(torch.int8)
    return values, col_max.squeeze(-2).to(weight.dtype)


def dequantize_last_axis(values, scales, dtype):
    """int values x per-column scale, rounded once to `dtype`."""
    import torch

    return (values.to(torch.float32) * scales.to(torch.float32).unsqueeze(-2)).to(dtype)


def loadtime_weight(name: str, tensor, quant_algo: Optional[str], exclude_modules: Optional[list]):
    """The tensor `name` of one rank as the engine built from it holds it: dequantized from
    TensorRT-LLM's load-time quantization when weight_only_quantize_dict picks it, else unchanged.
    Same shape and dtype as `tensor` ([out, in] or [E, out, in])."""
    import torch

    if quant_algo not in WEIGHT_ONLY_ALGOS or tensor.dtype == torch.int8 or not weight_only_selects(name, exclude_modules):
        return tensor
    if tensor.dim() not in (2, 3):
        raise TrtbuildError(f"{name} ({list(tensor.shape)}): TensorRT-LLM 1.2's weight-only preprocessing quantizes it "
                            "and its quantize op raises 'Invalid dim. The dim of weight should be 2 or 3'")
    transposed = tensor.transpose(-1, -2).contiguous()  # [.., in, out]: the last axis is the output channel
    values, scales = symmetric_quantize_last_axis(transposed, BITS[quant_algo])
    return dequantize_last_axis(values, scales, tensor.dtype).transpose(-1, -2).contiguous()
