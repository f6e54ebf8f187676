"""The quantized model as a small artifact: ModelOpt's state, the quantizer buffers and the scales
that replay in-place weight rewrites, not the weights. `restore_quantized` rebuilds the exact
quantized model from the source checkpoint and this folder (sha256-checked)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from trtbuild.checkpoint.modelopt_config import modelopt_modules
from trtbuild.checkpoint.torch_model import load_model, model_dtype
from trtbuild.checkpoint.weight_rewrites import digest, digests, replay_scale
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.store.hash import file_sha256

STATE_FILE = "modelopt_state.pth"
QUANTIZERS_FILE = "quantizers.safetensors"
SCALES_FILE = "scales.safetensors"
WEIGHTS_FILE = "weights.safetensors"
MANIFEST_FILE = "quantized.json"


def quantizer_tensors(model) -> dict:
    """Parameters and buffers of the ModelOpt quantizers (amax, pre_quant_scale, ...)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    prefixes = tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, TensorQuantizer))
    return {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}


def _sorted_dicts(value: Any) -> Any:
    """The state with every dict's items in key order (ModelOpt restores attributes by name)."""
    if isinstance(value, dict):
        return {k: _sorted_dicts(value[k]) for k in sorted(value, key=repr)}
    if isinstance(value, list):
        return [_sorted_dicts(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_sorted_dicts(v) for v in value)
    return value


def save_quantized(model, folder: Union[Path, str]) -> dict:
    """Save what rebuilds the exact quantized model from the source checkpoint, and nothing more:

    - `modelopt_state.pth`: mto.modelopt_state (quantizer layout and properties);
    - `quantizers.safetensors`: the quantizer buffers (amax, pre_quant_scale, ...);
    - `scales.safetensors`: for each weight SmoothQuant/AWQ rewrote in place, the fp32 scale(s)
      that replay the rewrite exactly (`RecordWeightScaling`); one vector per Linear input;
    - `weights.safetensors`: any other changed weight in full (none for the formats here);
    - `quantized.json`: the manifest, with the sha256 of every source and quantized parameter.
    Returns the manifest."""
    import modelopt
    import torch
    from safetensors.torch import save_file

    _, mto = modelopt_modules()
    source = getattr(model, "_trtbuild_source_digests", None)
    if source is None:
        raise TrtbuildError("save_quantized: the model was not quantized by calibrate_and_quantize "
                            "(its in-place weight changes are unknown)")
    scalings = getattr(model, "_trtbuild_weight_scalings", {})
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # The same state must give the same bytes: ModelOpt fills some dicts from sets (their order
    # follows the process's hash seed), and the zip format writes a random serialization id.
    torch.save(_sorted_dicts(mto.modelopt_state(model)), folder / STATE_FILE, _use_new_zipfile_serialization=False)

    def cpu(t):
        return t.detach().to("cpu").contiguous().clone()

    current = digests(model)  # hashed again here: the weights may have changed since calibration
    params = dict(model.named_parameters())
    scales: dict[str, Any] = {}
    weights: dict[str, Any] = {}
    changed: dict[str, dict] = {}
    for name in sorted(k for k in current if current[k] != source.get(k)):
        chain = scalings.get(name, [])
        replayable = (bool(chain) and chain[0]["before"] == source.get(name) and chain[-1]["after"] == current[name]
                      and all(a["after"] == b["before"] for a, b in zip(chain, chain[1:])))
        if replayable:
            for i, call in enumerate(chain):
                scales[f"{name}#{i}"] = call["scale"].contiguous()
            # sha256 of the source weight, then after each replayed rewrite.
            changed[name] = {"replay": [chain[0]["before"]] + [c["after"] for c in chain]}
        else:
            weights[name] = cpu(params[name])
            changed[name] = {"stored": True}
    quantizers = {k: cpu(v) for k, v in quantizer_tensors(model).items()}
    save_file(quantizers, str(folder / QUANTIZERS_FILE))
    save_file(scales, str(folder / SCALES_FILE))
    save_file(weights, str(folder / WEIGHTS_FILE))
    files = {name: {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)}
             for name in (STATE_FILE, QUANTIZERS_FILE, SCALES_FILE, WEIGHTS_FILE)}
    manifest = {
        "format": "trtbuild-modelopt-state/1",
        "modelopt_version": modelopt.__version__,
        "torch_version": torch.__version__,
        "dtype": model_dtype(model),
        **getattr(model, "_trtbuild_quant", {}),
        "quantizer_tensors": len(quantizers),
        "changed_weights": changed,
        "source_sha256": {k: source[k] for k in sorted(source)},
        "quantized_sha256": current,
        "files": files,
        "bytes": sum(f["bytes"] for f in files.values()),
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def restore_quantized(source_dir: Union[Path, str], folder: Union[Path, str], dtype: str, device: str):
    """The quantized model, rebuilt bit for bit from the source checkpoint plus `save_quantized`'s
    folder (every parameter is checked against the sha256 recorded at save time)."""
    import modelopt
    from safetensors.torch import load_file

    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{folder}: no readable {MANIFEST_FILE}: {e}")
    if manifest.get("dtype") != dtype:
        raise InvalidInput(f"{folder}: quantized in {manifest.get('dtype')}, cannot restore in {dtype}")
    if manifest.get("modelopt_version") != modelopt.__version__:
        raise InvalidInput(f"{folder}: saved by ModelOpt {manifest.get('modelopt_version')}, "
                           f"this is {modelopt.__version__}")
    for name, info in manifest["files"].items():
        if file_sha256(folder / name) != info["sha256"]:
            raise InvalidInput(f"{folder}: {name} does not match its sha256 in {MANIFEST_FILE}")
    _, mto = modelopt_modules()
    model = load_model(source_dir, dtype, "cpu")
    source = digests(model)
    if source != manifest["source_sha256"]:
        diff = sorted(k for k in set(source) | set(manifest["source_sha256"])
                      if source.get(k) != manifest["source_sha256"].get(k))
        raise InvalidInput(f"{source_dir}: not the checkpoint {folder} was quantized from "
                           f"({len(diff)} of {len(source)} parameters differ, e.g. {diff[0]})")
    state = mto.load_modelopt_state(folder / STATE_FILE)
    model = mto.restore_from_modelopt_state(model, modelopt_state=state)
    quantizers = load_file(str(folder / QUANTIZERS_FILE))
    expected = set(quantizer_tensors(model))
    if expected != set(quantizers):
        raise InvalidInput(f"{folder}: quantizer tensors do not match the restored model "
                           f"(missing {sorted(expected - set(quantizers))[:3]}, "
                           f"extra {sorted(set(quantizers) - expected)[:3]})")
    weights = load_file(str(folder / WEIGHTS_FILE))
    _missing, unexpected = model.load_state_dict({**quantizers, **weights}, strict=False)
    if unexpected:
        raise InvalidInput(f"{folder}: tensors the model does not have: {sorted(unexpected)[:5]}")
    scales = load_file(str(folder / SCALES_FILE))
    params = dict(model.named_parameters())
    for name, how in manifest["changed_weights"].items():
        chain = how.get("replay", [])
        for i, expected in enumerate(chain[1:]):
            replay_scale(params[name], scales[f"{name}#{i}"])
            if digest(params[name]) != expected:
                raise TrtbuildError(f"{folder}: replaying the in-place rescale of {name} did not reproduce it "
                                    "exactly; this ModelOpt/torch build rewrites weights differently")
    restored = digests(model)
    bad = sorted(k for k in restored if restored[k] != manifest["quantized_sha256"].get(k))
    if bad:
        raise TrtbuildError(f"{folder}: restoring did not reproduce {len(bad)} quantized weights exactly "
                            f"(e.g. {bad[0]}); this ModelOpt/torch build rewrites weights differently")
    model._trtbuild_source_digests = dict(manifest["source_sha256"])
    # Re-saving a restored model stores the same scales again.
    model._trtbuild_weight_scalings = {
        name: [{"before": chain[i], "after": chain[i + 1], "scale": scales[f"{name}#{i}"]}
               for i in range(len(chain) - 1)]
        for name, chain in ((n, h.get("replay", [])) for n, h in manifest["changed_weights"].items()) if chain}
    model._trtbuild_quant = {k: manifest.get(k) for k in ("quant", "kv_cache", "group_size")}
    model.to(device)
    model.eval()
    return model
