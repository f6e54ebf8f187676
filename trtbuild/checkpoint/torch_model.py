"""A Hugging Face causal LM loaded for quantization, in the recipe's dtype (so the HF export is not
float32: export_hf_checkpoint does not cast unquantized tensors). torch and transformers are
imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from trtbuild.errors import InvalidInput

DTYPES = ("bfloat16", "float16", "float32")


def torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise InvalidInput(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def load_model(source_dir: Union[Path, str], dtype: str, device: str):
    """AutoModelForCausalLM from a HF folder in `dtype`, eval mode, on `device`."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch_dtype(dtype), "low_cpu_mem_usage": True}
    if str(device).startswith("cuda"):
        kwargs["device_map"] = {"": str(device)}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(source_dir), **kwargs)
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{source_dir}: cannot load the model: {e}")
    model.to(device)
    model.eval()
    return model


def model_dtype(model) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")
