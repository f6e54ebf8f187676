"""Post-training quantization with NVIDIA ModelOpt 0.47, run inside a worker process.

This module is the public interface; the work is in torch_model (load), modelopt_config (the
ModelOpt config of a format), calibrate, weight_rewrites, quantstate (save/restore) and
modelopt_export. torch, transformers and modelopt are imported lazily inside the functions
(`import modelopt.torch.quantization` alone takes 5-20 s), so importing this module is cheap.

Flow: `load_model` (in the recipe's dtype, so the HF export is not float32) ->
`calibrate_and_quantize` (mtq.quantize with a forward loop over the calibration windows) ->
`save_quantized` (small: ModelOpt state, quantizer buffers, the scales that replay in-place
weight rewrites) ->
`export_trtllm` / `export_hf`. `restore_quantized` rebuilds the exact quantized model from the
source checkpoint and the saved state.

ModelOpt 0.47 facts this module relies on (see reference/modelopt.md and the tests):
- configs are lists of {"quantizer_name", "cfg"/"enable"} entries; a KV-cache config is appended;
- SmoothQuant and AWQ (awq_lite) fold their per-channel pre_quant_scale into the Linear weights in
  place (`model_calib._apply_weight_pre_quant_scale`: weight.data.copy_(weight * 1/scale)); the
  saved state records those fp32 scales and replays them exactly (sha256-checked);
- dynamic block formats (NVFP4, MX*) assert `amax.is_cuda`: they cannot be calibrated on a CPU;
- both exports mutate the model (TRT-LLM: AWQ resmoothing of q/k/v and gate/up; HF: always), so
  they run on deep copies; `export_hf_checkpoint` does not cast unquantized tensors, hence
  loading in the target dtype.
"""

from trtbuild.checkpoint.calibrate import calibrate_and_quantize
from trtbuild.checkpoint.modelopt_config import needs_cuda, quant_config
from trtbuild.checkpoint.modelopt_export import HF_FLOAT32_BY_DESIGN, export_hf, export_trtllm, kv_cache_format
from trtbuild.checkpoint.quantstate import restore_quantized, save_quantized
from trtbuild.checkpoint.torch_model import load_model

__all__ = ["HF_FLOAT32_BY_DESIGN", "calibrate_and_quantize", "export_hf", "export_trtllm", "kv_cache_format",
           "load_model", "needs_cuda", "quant_config", "restore_quantized", "save_quantized"]
