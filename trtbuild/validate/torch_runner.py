"""The torch runner: teacher-forced log-probabilities of the reference model and of a candidate
(an unquantized checkpoint read back, a W8A16 one read back as TensorRT-LLM quantizes it at
load, or the exact ModelOpt-quantized model restored from its state), one window at a time so
memory holds one window's logits, never the whole set.

On a CPU both run in float32: weights keep their stored values (a bf16 or fp16 weight is exact in
float32), and float32 matmuls are about 10x faster than 16-bit ones on CPUs (test-assets.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trtbuild.validate.metrics import TOP_K, Comparison, kl_topk, topk_reference


def _compute_dtype(device: str, dtype: str):
    import torch

    return torch.float32 if device == "cpu" else getattr(torch, dtype)


def _log_probs(model, window: np.ndarray, device: str) -> np.ndarray:
    """log-softmax of the logits that predict tokens 1..L-1 of the window: [L-1, V] float32."""
    import torch

    ids = torch.from_numpy(window.astype(np.int64))[None].to(device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).cpu().numpy()


def load_source(source: Path, device: str, dtype: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=_compute_dtype(device, dtype))
    return model.to(device).eval()


def load_trtllm_checkpoint(checkpoint: Path, source: Path, device: str, dtype: str):
    """An unquantized TensorRT-LLM checkpoint read back into the Hugging Face model it came from; a
    W8A16 one (float weights TensorRT-LLM quantizes at load) with its weight-only linears as
    TensorRT-LLM 1.2 quantizes them (trtllm_inverse -> checkpoint/trtllm_loadtime.py)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtbuild.checkpoint.trtllm_inverse import trtllm_to_hf_state

    hf_config = json.loads((source / "config.json").read_text())
    state = trtllm_to_hf_state(checkpoint, hf_config)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source), dtype=getattr(torch, dtype))
    model.load_state_dict(state, strict=not hf_config.get("tie_word_embeddings"))
    if hf_config.get("tie_word_embeddings"):
        model.tie_weights()
    return _cast(model, _compute_dtype(device, dtype)).to(device).eval()


def _cast(model, dtype):
    """`model.to(dtype)` except its non-persistent buffers (the rotary embedding's inv_freq):
    transformers computes those in float32 and from_pretrained never casts them. Cast to bfloat16,
    RoPE's angles lose precision and the model no longer computes what the source model does (on
    a GPU, where validation computes in bfloat16, the unquantized checkpoint failed its gates)."""
    kept = [(module, name, buffer) for module in model.modules() for name, buffer in module._buffers.items()
            if buffer is not None and name in module._non_persistent_buffers_set]
    model.to(dtype)
    for module, name, buffer in kept:
        module._buffers[name] = buffer
    return model


def compute_dtype_name(device: str, dtype: str) -> str:
    return str(_compute_dtype(device, dtype)).replace("torch.", "")


def in_compute_dtype(model, device: str, dtype: str):
    """`model` as the runner computes with it: itself when it is in the compute dtype already, else a
    cast deep copy (a cast in place would change the caller's model, quantizer buffers included)."""
    import copy

    wanted = _compute_dtype(device, dtype)
    if next(model.parameters()).dtype == wanted:
        return model.eval()
    return _cast(copy.deepcopy(model), wanted).eval()


def reference(model, windows: np.ndarray, device: str, k: int = TOP_K, progress=None) -> dict[str, np.ndarray]:
    ids, logps, targets = [], [], []
    for i, window in enumerate(windows):
        logp = _log_probs(model, window, device)
        top_ids, top_logp = topk_reference(logp, k)
        ids.append(top_ids)
        logps.append(top_logp)
        targets.append(logp[np.arange(len(window) - 1), window[1:]])
        if progress:
            progress(i + 1, len(windows))
    return {"topk_ids": np.stack(ids), "topk_logp": np.stack(logps), "target_logp": np.stack(targets).astype(np.float32)}


def compare(model, windows: np.ndarray, ref: dict[str, np.ndarray], device: str, progress=None) -> Comparison:
    return compare_log_probs(lambda window: _log_probs(model, window, device), windows, ref, progress)


def compare_log_probs(log_probs, windows: np.ndarray, ref: dict[str, np.ndarray], progress=None) -> Comparison:
    """The candidate whose full log-probabilities per window `log_probs(window)` gives ([L-1, V]),
    against the reference: the one comparison of every runner that sees the whole distribution."""
    kl, top1, cand_nll = [], [], []
    for i, window in enumerate(windows):
        logp = log_probs(window)
        kl.append(kl_topk(ref["topk_ids"][i], ref["topk_logp"][i], logp))
        top1.append((logp.argmax(axis=-1) == ref["topk_ids"][i][:, 0]).astype(np.float64))
        cand_nll.append(-logp[np.arange(len(window) - 1), window[1:]].astype(np.float64))
        if progress:
            progress(i + 1, len(windows))
    return Comparison(kl=np.stack(kl), top1=np.stack(top1), ref_nll=-ref["target_logp"].astype(np.float64),
                      cand_nll=np.stack(cand_nll))
