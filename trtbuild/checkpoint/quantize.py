"""Post-training quantization with NVIDIA ModelOpt 0.47, run inside a worker process.

torch, transformers and modelopt are imported lazily inside the functions (`import
modelopt.torch.quantization` alone takes 5-20 s), so importing this module is cheap.

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

from __future__ import annotations

import copy
import hashlib
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from trtbuild.checkpoint.hf_layout import FAMILIES
from trtbuild.quantformats import FORMATS, KV_FORMATS, PER_GROUP_ALGOS
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.modelconfig import read_json_object
from trtbuild.modelfiles import copy_companion_files
from trtbuild.store.hash import file_sha256

# The formats, their ModelOpt configs and what the exports write: trtbuild/quantformats.py.
_INT8_KV_ENTRY = {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}


DTYPES = ("bfloat16", "float16", "float32")

STATE_FILE = "modelopt_state.pth"
QUANTIZERS_FILE = "quantizers.safetensors"
SCALES_FILE = "scales.safetensors"
WEIGHTS_FILE = "weights.safetensors"
MANIFEST_FILE = "quantized.json"


# Tensors of a unified HF checkpoint that ModelOpt keeps float32 whatever the model dtype:
# quantization scales (weight_scale, weight_scale_2, input_scale, k_scale, v_scale).
# pre_quant_scale is written in the model dtype.
HF_FLOAT32_BY_DESIGN = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale")

_mtq = None


def _modelopt():
    """(mtq, mto), imported once per process."""
    global _mtq
    if _mtq is None:
        import modelopt.torch.opt as mto
        import modelopt.torch.quantization as mtq

        _mtq = (mtq, mto)
    return _mtq


def _check_quant(quant: Optional[str], kv_cache: Optional[str]) -> None:
    if quant is not None and quant not in FORMATS:
        raise InvalidInput(f"quantization {quant!r}: expected one of {', '.join(FORMATS)}")
    if kv_cache is not None and kv_cache not in KV_FORMATS:
        raise InvalidInput(f"kv_cache {kv_cache!r}: expected one of {', '.join(KV_FORMATS)}")
    if quant is None and kv_cache is None:
        raise InvalidInput("nothing to quantize: neither a quantization nor a kv_cache format")


def needs_cuda(quant: Optional[str], kv_cache: Optional[str]) -> Optional[str]:
    """Why this combination cannot be calibrated on a CPU, or None when it can. Cheap: no import."""
    if quant is not None or kv_cache is not None:
        _check_quant(quant, kv_cache)
    reasons = []
    if quant is not None and FORMATS[quant].cuda_only:
        reasons.append(f"quantization {quant}: {FORMATS[quant].cuda_only}")
    if kv_cache is not None and KV_FORMATS[kv_cache].cuda_only:
        reasons.append(f"kv_cache {kv_cache}: {KV_FORMATS[kv_cache].cuda_only}")
    return "; ".join(reasons) or None


def quant_config(quant: Optional[str], kv_cache: Optional[str], group_size: Optional[int] = None) -> dict:
    """The ModelOpt config for a quantization name and KV-cache format (a deep copy; ModelOpt's
    module-level configs are never touched). `group_size` sets the per-group block size of the
    INT4 weight formats (default 128) and is ignored by the others."""
    _check_quant(quant, kv_cache)
    if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool)
                                   or group_size < 1):
        raise InvalidInput(f"group_size must be a positive integer, got {group_size!r}")
    mtq, _ = _modelopt()
    if quant is None:
        # KV cache only: every other quantizer off.
        cfg: dict[str, Any] = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    else:
        cfg = copy.deepcopy(getattr(mtq, FORMATS[quant].modelopt_config))
    if quant is not None and FORMATS[quant].grouped:
        size = group_size or FORMATS[quant].default_group_size
        found = 0
        for entry in cfg["quant_cfg"]:
            if entry.get("quantizer_name") != "*weight_quantizer" or "cfg" not in entry:
                continue
            parts = entry["cfg"] if isinstance(entry["cfg"], list) else [entry["cfg"]]
            for part in parts:
                if part.get("num_bits") == 4 and part.get("block_sizes"):
                    part["block_sizes"][-1] = size
                    found += 1
        if found != 1:
            raise RuntimeError(f"{FORMATS[quant].modelopt_config}: expected one INT4 block weight quantizer, "
                               f"found {found}")
    if kv_cache is not None:
        name = KV_FORMATS[kv_cache].modelopt_config
        entries = [copy.deepcopy(_INT8_KV_ENTRY)] if name is None else copy.deepcopy(getattr(mtq, name)["quant_cfg"])
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + entries
    return cfg


def _torch_dtype(dtype: str):
    import torch

    if dtype not in DTYPES:
        raise InvalidInput(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    return getattr(torch, dtype)


def load_model(source_dir: Union[Path, str], dtype: str, device: str):
    """AutoModelForCausalLM from a HF folder in `dtype`, eval mode, on `device`."""
    from transformers import AutoModelForCausalLM

    torch_dtype = _torch_dtype(dtype)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "low_cpu_mem_usage": True}
    if str(device).startswith("cuda"):
        kwargs["device_map"] = {"": str(device)}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(source_dir), **kwargs)
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{source_dir}: cannot load the model: {e}")
    model.to(device)
    model.eval()
    return model


# ----------------------------------------------------------------------------------------------
# Calibration


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text
                                            or "DefaultCPUAllocator" in text)


def _available_bytes(device: str) -> int:
    import torch

    if str(device).startswith("cuda"):
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free * 0.6)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 4 << 30


def _bytes_per_window(model, seq_len: int) -> int:
    """A generous estimate of the activation memory one calibration window needs in one forward
    (one decoder layer's activations live at a time, plus the attention matrix)."""
    cfg = model.config
    hidden = int(getattr(cfg, "hidden_size", 4096))
    inter = int(getattr(cfg, "intermediate_size", 4 * hidden) or 4 * hidden)
    heads = int(getattr(cfg, "num_attention_heads", 32))
    return seq_len * (16 * hidden + 6 * inter) * 4 + 2 * heads * seq_len * seq_len * 4


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is <= cap (>= 1): every batch has the same size."""
    cap = max(1, min(n, cap))
    return next(d for d in range(cap, 0, -1) if n % d == 0)


def _forward_kwargs(model) -> dict:
    import inspect

    kwargs: dict[str, Any] = {"use_cache": False}
    try:
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kwargs["logits_to_keep"] = 1  # lm_head is never quantized: skip the full logits
    except (TypeError, ValueError):
        pass
    return kwargs


def _probe_batch_size(model, windows: np.ndarray, device: str, start: int, log) -> tuple[int, list[int]]:
    """On CUDA, run one unquantized forward at the candidate batch size, halving (to a divisor of
    the window count) on out-of-memory. On a CPU an allocation failure usually ends in the OOM
    killer rather than an exception, so the estimate alone decides there."""
    import torch

    tried = [start]
    if not str(device).startswith("cuda"):
        return start, tried
    n = windows.shape[0]
    size = start
    kwargs = _forward_kwargs(model)
    while True:
        try:
            with torch.no_grad():
                ids = torch.from_numpy(windows[:size].astype(np.int64)).to(device)
                model(input_ids=ids, **kwargs)
            torch.cuda.synchronize(device)
            return size, tried
        except Exception as e:  # noqa: BLE001 - only OOM is handled
            if not _is_oom(e) or size == 1:
                raise
            torch.cuda.empty_cache()
            size = _divisor_at_most(n, size // 2)
            tried.append(size)
            log(f"calibrate: out of memory with batch size {tried[-2]}; trying {size}")


_PASS_LABELS = {
    "awq_lite": ["awq_lite: caching activation statistics", "awq_lite: searching pre_quant_scale alphas"],
    "smoothquant": ["smoothquant: max calibration of per-channel activation ranges"],
    "max": ["max calibration of activations"],
}


def _digest(tensor) -> str:
    """sha256 of a tensor's bytes (exact: any changed bit changes it)."""
    import torch

    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.reshape(-1).contiguous().view(torch.uint8)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def _digests(model) -> dict[str, str]:
    """sha256 of every parameter, to find and verify what quantization changed in place."""
    return {name: _digest(p) for name, p in model.named_parameters()}


class _RecordWeightScaling:
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
            before = _digest(linear.weight)
            recorder._orig(linear, pre_quant_scale)
            after = _digest(linear.weight)
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


def _replay_scale(param, scale) -> None:
    """The weight rewrite of ModelOpt 0.47's `_apply_weight_pre_quant_scale`, expression for expression."""
    import torch

    with torch.no_grad():
        param.data.copy_((param * scale.to(param.device).squeeze()[None, :]).to(param.dtype))


def calibrate_and_quantize(model, quant: Optional[str], kv_cache: Optional[str], group_size: Optional[int],
                           windows: np.ndarray, device: str,
                           progress: Optional[Callable[[int, int], None]] = None,
                           max_batch: Optional[int] = None) -> dict:
    """Quantize `model` in place with ModelOpt, calibrating on `windows` (int [samples, seq_len]).

    The batch size is the largest divisor of the window count that fits the memory estimate (at
    most 64 or `max_batch`); on CUDA it is probed with one unquantized forward and halved on OOM.
    Max calibration (fp8, int8_sq, *_wo, KV caches) takes maxima, so equal batches give the same
    result whatever their size; AWQ's statistics depend on the batch size, so AWQ is pinned to
    one window per batch (`batch_size_pinned`).
    `progress(done, total)` is called after every batch, counting the batches of all calibration
    passes (AWQ makes two: caching activation statistics, then the alpha search); a line per batch
    is printed too, for the worker log.
    Returns a report: seconds, peak_rss_bytes, cuda_peak_bytes, batches, batch_size, passes, ...
    """
    import torch

    reason = needs_cuda(quant, kv_cache)
    if reason and not str(device).startswith("cuda"):
        raise InvalidInput(f"cannot quantize on {device}: {reason}")
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[0] < 1 or windows.shape[1] < 1:
        raise InvalidInput(f"calibration windows must be a non-empty [samples, seq_len] array, got {windows.shape}")
    cfg = quant_config(quant, kv_cache, group_size)
    mtq, _ = _modelopt()
    algorithm = cfg.get("algorithm")
    method = algorithm.get("method") if isinstance(algorithm, dict) else algorithm
    labels = _PASS_LABELS.get(str(method), [f"{method} calibration"])

    def log(line: str) -> None:
        print(line, flush=True)

    t0 = time.perf_counter()
    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    n, seq_len = windows.shape
    pinned = str(method).startswith("awq")
    if pinned:
        # AWQ averages per-batch activation means that ModelOpt computes in the model dtype
        # (awq_lite.get_act_scale: x.abs().mean(0) on bf16), so another batch size moves act_scale
        # by ~0.5% and can flip the alpha chosen per Linear: one window per batch keeps the result
        # independent of the memory available (batch 1 is also the least memory there is).
        batch_size, tried = 1, [1]
        log("calibrate: AWQ calibrates one window per batch (its statistics depend on the batch size)")
    else:
        estimate = max(1, _available_bytes(device) // max(1, _bytes_per_window(model, seq_len)))
        cap = min(64, estimate, max_batch or 64)
        batch_size, tried = _probe_batch_size(model, windows, device, _divisor_at_most(n, cap), log)
    batches_per_pass = n // batch_size
    expected_batches = len(labels) * batches_per_pass
    state = {"passes": 0, "batches": 0}
    kwargs = _forward_kwargs(model)
    before = _digests(model)
    recorder = _RecordWeightScaling(model)

    def forward_loop(m) -> None:
        state["passes"] += 1
        label = labels[min(state["passes"], len(labels)) - 1]
        log(f"calibrate: pass {state['passes']} ({label}): {batches_per_pass} batches of {batch_size} "
            f"windows x {seq_len} tokens")
        for b in range(batches_per_pass):
            tb = time.perf_counter()
            ids = torch.from_numpy(windows[b * batch_size:(b + 1) * batch_size].astype(np.int64)).to(device)
            with torch.no_grad():
                m(input_ids=ids, **kwargs)
            state["batches"] += 1
            total = max(expected_batches, state["batches"] + batches_per_pass - b - 1)
            log(f"calibrate: pass {state['passes']} batch {b + 1}/{batches_per_pass} "
                f"({time.perf_counter() - tb:.2f} s; {state['batches']}/{total} batches in all)")
            if progress is not None:
                progress(state["batches"], total)

    try:
        with recorder:
            mtq.quantize(model, cfg, forward_loop=forward_loop)
    except Exception as e:  # noqa: BLE001
        if _is_oom(e):
            raise TrtbuildError(f"calibration ran out of memory at batch size {batch_size}; "
                                f"reload the model and run again with max_batch={max(1, batch_size // 2)}") from e
        raise
    if quant is not None and FORMATS[quant].quant_algo in PER_GROUP_ALGOS and not FORMATS[quant].awq:
        _ones_pre_quant_scale(model)  # int4_wo: an AWQ layout without the AWQ search
    after = _digests(model)
    changed = sorted(k for k in after if before.get(k) != after[k])
    unexplained = [k for k in changed if k not in recorder.calls]
    # For save_quantized: the source digests, and how ModelOpt rewrote weights in place.
    model._trtbuild_source_digests = before
    model._trtbuild_weight_scalings = recorder.calls
    grouped = quant is not None and FORMATS[quant].grouped
    model._trtbuild_quant = {"quant": quant, "kv_cache": kv_cache,
                             "group_size": (group_size or FORMATS[quant].default_group_size) if grouped else None}
    seconds = time.perf_counter() - t0
    report = {
        "quant": quant, "kv_cache": kv_cache, "group_size": model._trtbuild_quant["group_size"],
        "algorithm": method, "device": str(device), "seconds": round(seconds, 3),
        "windows": int(n), "seq_len": int(seq_len), "passes": state["passes"], "batches": state["batches"],
        "batch_size": batch_size, "batch_size_pinned": pinned, "batch_sizes_tried": tried,
        "changed_weights": len(changed), "changed_weights_unexplained": len(unexplained),
        "peak_rss_bytes": _peak_rss(),
        "cuda_peak_bytes": int(torch.cuda.max_memory_allocated(device)) if str(device).startswith("cuda") else None,
    }
    log(f"calibrate: {quant or 'none'}{'+kv ' + kv_cache if kv_cache else ''} done in {seconds:.1f} s, "
        f"{state['batches']} batches of {batch_size}, {len(changed)} weights changed in place")
    return report


def _peak_rss() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _ones_pre_quant_scale(model) -> None:
    """int4_wo exports as W4A16_AWQ, whose TensorRT-LLM layer (pre_quant_scale: true) requires a
    prequant_scaling_factor tensor; ModelOpt writes it only when the input quantizer has one. A
    scale of ones (what awq_lite itself uses for linears it could not search) is the identity."""
    import torch
    from modelopt.torch.quantization.utils import is_quantized_linear

    for module in model.modules():
        if not is_quantized_linear(module) or not module.weight_quantizer.is_enabled:
            continue
        iq = module.input_quantizer
        if getattr(iq, "_pre_quant_scale", None) is None:
            iq._enable_pre_quant_scale = True
            iq.pre_quant_scale = torch.ones(module.weight.shape[1], dtype=module.weight.dtype,
                                            device=module.weight.device)


# ----------------------------------------------------------------------------------------------
# Save / restore


def _quantizer_tensors(model) -> dict:
    """Parameters and buffers of the ModelOpt quantizers (amax, pre_quant_scale, ...)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    prefixes = tuple(f"{name}." for name, m in model.named_modules() if isinstance(m, TensorQuantizer))
    return {k: v for k, v in model.state_dict().items() if k.startswith(prefixes)}


def save_quantized(model, folder: Union[Path, str]) -> dict:
    """Save what rebuilds the exact quantized model from the source checkpoint, and nothing more:

    - `modelopt_state.pth`: mto.modelopt_state (quantizer layout and properties);
    - `quantizers.safetensors`: the quantizer buffers (amax, pre_quant_scale, ...);
    - `scales.safetensors`: for each weight SmoothQuant/AWQ rewrote in place, the fp32 scale(s)
      that replay the rewrite exactly (`_RecordWeightScaling`); one vector per Linear input;
    - `weights.safetensors`: any other changed weight in full (none for the formats here);
    - `quantized.json`: the manifest, with the sha256 of every source and quantized parameter.
    Returns the manifest."""
    import modelopt
    import torch
    from safetensors.torch import save_file

    _, mto = _modelopt()
    source = getattr(model, "_trtbuild_source_digests", None)
    if source is None:
        raise TrtbuildError("save_quantized: the model was not quantized by calibrate_and_quantize "
                            "(its in-place weight changes are unknown)")
    scalings = getattr(model, "_trtbuild_weight_scalings", {})
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(mto.modelopt_state(model), folder / STATE_FILE)

    def cpu(t):
        return t.detach().to("cpu").contiguous().clone()

    current = _digests(model)  # hashed again here: the weights may have changed since calibration
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
    quantizers = {k: cpu(v) for k, v in _quantizer_tensors(model).items()}
    save_file(quantizers, str(folder / QUANTIZERS_FILE))
    save_file(scales, str(folder / SCALES_FILE))
    save_file(weights, str(folder / WEIGHTS_FILE))
    files = {name: {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)}
             for name in (STATE_FILE, QUANTIZERS_FILE, SCALES_FILE, WEIGHTS_FILE)}
    manifest = {
        "format": "trtbuild-modelopt-state/1",
        "modelopt_version": modelopt.__version__,
        "torch_version": torch.__version__,
        "dtype": _model_dtype(model),
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
    _, mto = _modelopt()
    model = load_model(source_dir, dtype, "cpu")
    source = _digests(model)
    if source != manifest["source_sha256"]:
        diff = sorted(k for k in set(source) | set(manifest["source_sha256"])
                      if source.get(k) != manifest["source_sha256"].get(k))
        raise InvalidInput(f"{source_dir}: not the checkpoint {folder} was quantized from "
                           f"({len(diff)} of {len(source)} parameters differ, e.g. {diff[0]})")
    state = mto.load_modelopt_state(folder / STATE_FILE)
    model = mto.restore_from_modelopt_state(model, modelopt_state=state)
    quantizers = load_file(str(folder / QUANTIZERS_FILE))
    expected = set(_quantizer_tensors(model))
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
        for i, digest in enumerate(chain[1:]):
            _replay_scale(params[name], scales[f"{name}#{i}"])
            if _digest(params[name]) != digest:
                raise TrtbuildError(f"{folder}: replaying the in-place rescale of {name} did not reproduce it "
                                    "exactly; this ModelOpt/torch build rewrites weights differently")
    restored = _digests(model)
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


# ----------------------------------------------------------------------------------------------
# Export


def decoder_type(model) -> str:
    model_type = str(getattr(model.config, "model_type", ""))
    if model_type not in FAMILIES:
        raise InvalidInput(f"model_type {model_type!r} cannot be exported to TensorRT-LLM here "
                           f"(supported: {', '.join(sorted(FAMILIES))})")
    return FAMILIES[model_type]


def _model_dtype(model) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


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
        export_tensorrt_llm_checkpoint(work, decoder_type=decoder, dtype=_torch_dtype(dtype), export_dir=out_dir,
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
    dtype = _model_dtype(model)
    work = model if inplace else copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tensorrt_llm.*")
        export_hf_checkpoint(work, dtype=_torch_dtype(dtype), export_dir=out_dir)
    del work
    copied = copy_companion_files(source_dir, out_dir)
    config = read_json_object(out_dir / "config.json")
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        raise TrtbuildError(f"{out_dir}/config.json has no quantization_config")
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
        "tensors": tensors, "float32_tensors": len(float32), "copied": copied,
        "files": sorted(p.name for p in out_dir.iterdir()),
        "seconds": round(time.perf_counter() - t0, 3),
    }
