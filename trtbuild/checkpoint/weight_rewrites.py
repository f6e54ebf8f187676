"""What SmoothQuant and AWQ rewrite in place, recorded so that a restore replays it exactly.

Both fold their per-channel pre_quant_scale into the Linear weights
(`model_calib._apply_weight_pre_quant_scale`); the saved state keeps those fp32 scales and the
sha256 of the weight before and after each rewrite."""

from __future__ import annotations

import hashlib
from typing import Optional

def digest(tensor) -> str:
    """sha256 of a tensor's bytes (exact: any changed bit changes it)."""
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.reshape(-1).contiguous().view(torch.uint8)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def digests(model) -> dict[str, str]:
    """sha256 of every parameter, to find and verify what quantization changed in place."""
    return {name: digest(p) for name, p in model.named_parameters()}


class RecordWeightScaling:
    """Records every in-place weight rescale ModelOpt's SmoothQuant/AWQ do during mtq.quantize.

    Both end in `model_calib._apply_weight_pre_quant_scale(linear, scale)`, which (0.47) runs
    `linear.weight.data.copy_((linear.weight * scale.squeeze()[None, :]).to(weight.dtype))` with an
    fp32 `scale`. An elementwise fp32 product rounded to the weight dtype is exact IEEE arithmetic,
    so replaying it on the source weight reproduces the rewritten weight bit for bit; the sha256
    before and after each call is recorded, and `restore_quantized` checks it, so a replay that
    does not match fails loudly instead of being silently wrong."""

    def __init__(self, model):
        self.model = model
        self.calls: dict[str, list[dict]] = {}
        self._names: Optional[dict[int, str]] = None

    def __enter__(self):
        from modelopt.torch.quantization import model_calib

        self._mc = model_calib
        self._orig = model_calib._apply_weight_pre_quant_scale
        recorder = self

        def recording(linear, pre_quant_scale):
            before = digest(linear.weight)
            recorder._orig(linear, pre_quant_scale)
            after = digest(linear.weight)
            if after != before:
                if recorder._names is None:
                    recorder._names = {id(m): n for n, m in recorder.model.named_modules()}
                name = recorder._names.get(id(linear))
                key = f"{name}.weight" if name is not None else None
                recorder.calls.setdefault(key, []).append(
                    {"before": before, "after": after, "scale": pre_quant_scale.detach().to("cpu").clone()})

        model_calib._apply_weight_pre_quant_scale = recording
        return self

    def __exit__(self, *exc):
        self._mc._apply_weight_pre_quant_scale = self._orig
        return False


def replay_scale(param, scale) -> None:
    """The weight rewrite of ModelOpt 0.47's `_apply_weight_pre_quant_scale`, expression for expression."""
    import torch

    with torch.no_grad():
        param.data.copy_((param * scale.to(param.device).squeeze()[None, :]).to(param.dtype))
