"""Calibration: mtq.quantize with a forward loop over the calibration windows, in batches sized to
the memory available. Neither max calibration (maxima) nor AWQ (activation means kept per window
in float64, see AwqWindowMeans) depends on the batch size."""

from __future__ import annotations

import resource
import sys
import time
from typing import Any, Callable, Optional

import numpy as np

from trtbuild.checkpoint.modelopt_config import modelopt_modules, needs_cuda, quant_config
from trtbuild.checkpoint.weight_rewrites import RecordWeightScaling, digests
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.facts.quantformats import FORMATS, PER_GROUP_ALGOS


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


def calibrate_and_quantize(model, quant: Optional[str], kv_cache: Optional[str], group_size: Optional[int],
                           windows: np.ndarray, device: str,
                           progress: Optional[Callable[[int, int], None]] = None,
                           max_batch: Optional[int] = None) -> dict:
    """Quantize `model` in place with ModelOpt, calibrating on `windows` (int [samples, seq_len]).

    The batch size is the largest divisor of the window count that fits the memory estimate (at
    most 64 or `max_batch`); on CUDA it is probed with one unquantized forward and halved on OOM.
    Max calibration (fp8, int8_sq, *_wo, KV caches) takes maxima, so equal batches give the same
    result whatever their size; AWQ's activation means are summed per window in float64
    (AwqWindowMeans), so they do not depend on it either.
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
    mtq, _ = modelopt_modules()
    algorithm = cfg.get("algorithm")
    method = algorithm.get("method") if isinstance(algorithm, dict) else algorithm
    labels = _PASS_LABELS.get(str(method), [f"{method} calibration"])

    def log(line: str) -> None:
        print(line, flush=True)

    t0 = time.perf_counter()
    if str(device).startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    n, seq_len = windows.shape
    awq = str(method).startswith("awq")
    estimate = max(1, _available_bytes(device) // max(1, _bytes_per_window(model, seq_len)))
    cap = min(64, estimate, max_batch or 64)
    batch_size, tried = _probe_batch_size(model, windows, device, _divisor_at_most(n, cap), log)
    batches_per_pass = n // batch_size
    expected_batches = len(labels) * batches_per_pass
    state = {"passes": 0, "batches": 0}
    kwargs = _forward_kwargs(model)
    before = digests(model)
    recorder = RecordWeightScaling(model)

    window_means = AwqWindowMeans(model) if awq else None

    def forward_loop(m) -> None:
        state["passes"] += 1
        if window_means is not None:
            # awq_lite runs the loop twice: caching activation statistics, then the alpha search,
            # which reads act_scale; between the two, ours replaces its per-batch means.
            if state["passes"] == 1:
                window_means.start()
            else:
                window_means.replace_act_scales()
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
            try:
                mtq.quantize(model, cfg, forward_loop=forward_loop)
            finally:
                if window_means is not None:
                    window_means.stop()
    except Exception as e:  # noqa: BLE001
        if _is_oom(e):
            raise TrtbuildError(f"calibration ran out of memory at batch size {batch_size}; "
                                f"reload the model and run again with max_batch={max(1, batch_size // 2)}") from e
        raise
    if quant is not None and FORMATS[quant].quant_algo in PER_GROUP_ALGOS and not FORMATS[quant].awq:
        _ones_pre_quant_scale(model)  # int4_wo: an AWQ layout without the AWQ search
    after = digests(model)
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
        "batch_size": batch_size, "batch_sizes_tried": tried,
        "awq_statistics": "float64 per-window activation sums" if awq else None,
        "changed_weights": len(changed), "changed_weights_unexplained": len(unexplained),
        "peak_rss_bytes": _peak_rss(),
        "cuda_peak_bytes": int(torch.cuda.max_memory_allocated(device)) if str(device).startswith("cuda") else None,
    }
    log(f"calibrate: {quant or 'none'}{'+kv ' + kv_cache if kv_cache else ''} done in {seconds:.1f} s, "
        f"{state['batches']} batches of {batch_size}, {len(changed)} weights changed in place")
    return report


class AwqWindowMeans:
    """The per-channel mean |activation| that awq_lite searches its scales with, independent of
    the batch size.

    ModelOpt 0.47's awq_lite averages one mean per forward call, taken in the model's dtype
    (`get_act_scale`: x.abs().mean(0) in bfloat16, then float32): another batch size rounds each
    mean differently, moves act_scale by about 0.5% and can flip the alpha chosen for a Linear,
    which is why trtbuild used to calibrate AWQ one window at a time. Here a forward pre-hook on
    every Linear that awq_lite calibrates sums |x| of each window in float64 during the caching
    pass and adds the windows' sums in window order, so the sum is the same whatever the batches
    are; before the search pass, act_scale becomes that sum over the token count, in float32.
    For equal-length windows this is the mean ModelOpt computes, without its rounding; inputs
    without a window axis (MoE experts see routed tokens) are summed per batch, which leaves
    only float64 rounding. ModelOpt is pinned (0.47) and these are its internals: a ModelOpt
    without them stops the calibration with a message rather than quantizing differently."""

    def __init__(self, model) -> None:
        self.model = model
        self.sums: dict = {}
        self.tokens: dict = {}
        self.hooks: list = []

    def _modules(self):
        return [(name, m) for name, m in self.model.named_modules() if hasattr(m, "awq_lite")]

    def start(self) -> None:
        import torch

        modules = self._modules()
        if not modules or not all(hasattr(m.awq_lite, "act_scale") for _, m in modules):
            raise TrtbuildError("this ModelOpt's awq_lite keeps no act_scale per Linear (trtbuild needs "
                                "nvidia-modelopt 0.47): AWQ calibration stopped")

        def hook(module, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor) or x.numel() == 0:
                return
            channels = x.shape[-1]
            if x.dim() == 3:  # [windows, tokens, channels]: one float64 sum per window, added in order
                per_window = x.detach().abs().to(torch.float64).sum(dim=1)
                total = self.sums.get(module)
                for row in per_window:
                    total = row.clone() if total is None else total.add_(row)
                self.sums[module] = total
            else:
                flat = x.detach().reshape(-1, channels).abs().to(torch.float64).sum(dim=0)
                self.sums[module] = flat if module not in self.sums else self.sums[module].add_(flat)
            self.tokens[module] = self.tokens.get(module, 0) + x.numel() // channels

        self.hooks = [m.register_forward_pre_hook(hook) for _, m in modules]

    def replace_act_scales(self) -> None:
        import torch

        self.stop()
        for _, module in self._modules():
            helper = module.awq_lite
            if module not in self.sums or not isinstance(helper.act_scale, torch.Tensor):
                continue  # awq_lite saw no tokens for it either and has disabled its search
            mean = (self.sums[module] / self.tokens[module]).to(torch.float32)
            helper.act_scale = mean.to(helper.act_scale.device)
        self.sums.clear()
        self.tokens.clear()

    def stop(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []


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
