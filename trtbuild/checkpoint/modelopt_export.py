"""A quantized model's checkpoints, written by ModelOpt 0.47: TensorRT-LLM (export_tensorrt_llm_checkpoint,
config.json then corrected) and unified Hugging Face (export_hf_checkpoint). Both exports mutate
the model (TRT-LLM: AWQ resmoothing of q/k/v and gate/up; HF: always), so they run on deep copies
unless told otherwise."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Optional, Union

from trtbuild.checkpoint.hf_layout import FAMILIES
from trtbuild.checkpoint.torch_model import model_dtype, torch_dtype
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.model.config import read_json_object
from trtbuild.model.files import copy_companion_files
from trtbuild.facts.quantformats import KV_FORMATS

# Tensors of a unified HF checkpoint that ModelOpt keeps float32 whatever the model dtype:
# quantization scales (weight_scale, weight_scale_2, input_scale, k_scale, v_scale).
# pre_quant_scale is written in the model dtype.
HF_FLOAT32_BY_DESIGN = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")


def decoder_type(model) -> str:
    model_type = str(getattr(model.config, "model_type", ""))
    if model_type not in FAMILIES:
        raise InvalidInput(f"model_type {model_type!r} cannot be exported to TensorRT-LLM here "
                           f"(supported: {', '.join(sorted(FAMILIES))})")
    return FAMILIES[model_type]


def export_trtllm(model, out_dir: Union[Path, str], tp: int, pp: int, dtype: str, inplace: bool = False) -> dict:
    """A TensorRT-LLM checkpoint (config.json + rank{N}.safetensors) via ModelOpt's
    export_tensorrt_llm_checkpoint.

    The export mutates AWQ models (it resmooths q/k/v and gate/up to one shared pre_quant_scale,
    rewriting their weights and amax), so it runs on a deep copy unless `inplace` (for a caller
    that no longer needs the model and cannot afford the copy). config.json is then corrected by
    trtllm_config.fix_trtllm_config (rope fields from the HF config, Qwen's qwen_type/attn_bias, dtype and
    mapping); `patched` lists the changes."""
    import warnings

    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    from trtbuild.checkpoint.trtllm_config import fix_trtllm_config

    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (tp, pp)):
        raise InvalidInput(f"tp and pp must be positive integers, got tp={tp!r} pp={pp!r}")
    decoder = decoder_type(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    work = model if inplace else copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tensorrt_llm.*")
        export_tensorrt_llm_checkpoint(work, decoder_type=decoder, dtype=torch_dtype(dtype), export_dir=out_dir,
                                       inference_tensor_parallel=tp, inference_pipeline_parallel=pp)
    del work
    patched = fix_trtllm_config(out_dir, model.config.to_dict(), {"dtype": dtype, "tp": tp, "pp": pp})
    config = read_json_object(out_dir / "config.json")
    return {
        "decoder_type": decoder, "tp": tp, "pp": pp, "dtype": dtype,
        "quantization": config.get("quantization"), "patched": patched,
        "files": sorted(p.name for p in out_dir.iterdir()),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def kv_cache_format(model) -> Optional[str]:
    """fp8 / int8 / nvfp4 from the model's enabled k/v BMM quantizers, or None."""
    found = set()
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("k_bmm_quantizer", "v_bmm_quantizer") and getattr(module, "is_enabled", False):
            bits = module.num_bits
            bits = tuple(bits) if isinstance(bits, list) else bits
            found.add(next((name for name, f in KV_FORMATS.items() if f.num_bits == bits), str(bits)))
    if len(found) > 1:
        raise TrtbuildError(f"mixed KV-cache quantizers: {sorted(found)}")
    return found.pop() if found else None


def align_inline_quant_config(out_dir: Path) -> list[str]:
    """Make config.json's inline `quantization_config` say what hf_quant_config.json says.

    ModelOpt 0.47 writes an AWQ export's group_size into hf_quant_config.json only. TensorRT-LLM
    reads that file (and warns that the inline config diverges); vLLM and SGLang read the inline
    config first (the runtime table's sources vllm-0.33-modelopt, sglang-modelopt), so without this
    they see no group size.
    Returns the fields written."""
    import json

    config_path = out_dir / "config.json"
    config = read_json_object(config_path)
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise TrtbuildError(f"{config_path} has no quantization_config")
    if not (out_dir / "hf_quant_config.json").is_file():
        return []
    in_file = read_json_object(out_dir / "hf_quant_config.json").get("quantization") or {}
    fixes = []
    if in_file.get("group_size") is not None and qc.get("group_size") != in_file["group_size"]:
        qc["group_size"] = in_file["group_size"]
        fixes.append(f"quantization_config.group_size = {in_file['group_size']} (from hf_quant_config.json)")
    if fixes:  # ModelOpt's own layout: 4-space indent, keys in its order
        config_path.write_text(json.dumps(config, indent=4) + "\n")
    return fixes


def export_hf(model, out_dir: Union[Path, str], source_dir: Union[Path, str], inplace: bool = False) -> dict:
    """A unified Hugging Face checkpoint (export_hf_checkpoint on a deep copy, unless `inplace`: it
    mutates the model), with the tokenizer files and generation_config.json of the source. Checks that
    config.json has a quantization_config and that, for a 16-bit model, no tensor is float32
    except the quantization scales ModelOpt keeps float32 by design (HF_FLOAT32_BY_DESIGN)."""
    import warnings

    from modelopt.torch.export import export_hf_checkpoint
    from safetensors import safe_open

    kv = kv_cache_format(model)
    if kv is not None and not (kv in KV_FORMATS and KV_FORMATS[kv].hf_export):
        supported = " and ".join(name for name, f in KV_FORMATS.items() if f.hf_export)
        raise InvalidInput(f"kv_cache {kv}: ModelOpt 0.47's Hugging Face export supports only {supported} "
                           "KV caches (export a TensorRT-LLM checkpoint instead)")
    out_dir = Path(out_dir)
    source_dir = Path(source_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    dtype = model_dtype(model)
    work = model if inplace else copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tensorrt_llm.*")
        export_hf_checkpoint(work, dtype=torch_dtype(dtype), export_dir=out_dir)
    del work
    copied = copy_companion_files(source_dir, out_dir)
    inline_fixes = align_inline_quant_config(out_dir)
    config = read_json_object(out_dir / "config.json")
    qc = config.get("quantization_config")
    float32 = []
    tensors = 0
    for path in sorted(out_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                tensors += 1
                if f.get_slice(key).get_dtype() == "F32":
                    float32.append(key)
    unexpected = [k for k in float32 if k.rsplit(".", 1)[-1] not in HF_FLOAT32_BY_DESIGN]
    if dtype in ("bfloat16", "float16") and unexpected:
        raise TrtbuildError(f"{out_dir}: unquantized tensors exported as float32 from a {dtype} model: "
                            f"{', '.join(unexpected[:5])}")
    hf_quant = None
    if (out_dir / "hf_quant_config.json").is_file():
        hf_quant = read_json_object(out_dir / "hf_quant_config.json").get("quantization")
    return {
        "dtype": dtype, "quantization": hf_quant, "quant_algo": qc.get("quant_algo"),
        "tensors": tensors, "float32_tensors": len(float32), "copied": copied, "inline_config_fixes": inline_fixes,
        "files": sorted(p.name for p in out_dir.iterdir()),
        "seconds": round(time.perf_counter() - t0, 3),
    }
