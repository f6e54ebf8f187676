"""The ModelOpt 0.47 quantization config of a recipe's (quant, kv_cache, group_size), from the formats
table (trtbuild/facts/quantformats.py); ModelOpt is imported once, lazily (5-20 s).

ModelOpt 0.47's configs are lists of {"quantizer_name", "cfg"/"enable"} entries; a KV-cache config
is appended. Dynamic block formats (NVFP4, MX*) assert `amax.is_cuda`: no CPU calibration."""

from __future__ import annotations

import copy
import threading
from typing import Any, Optional

from trtbuild.errors import InvalidInput
from trtbuild.facts.quantformats import FORMATS, KV_FORMATS

# ModelOpt 0.47 has no INT8_KV_CFG: the INT8 KV cache entry is built here.
_INT8_KV_ENTRY = {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}

_mtq = None


def modelopt_modules():
    """(mtq, mto), imported once per process, in a thread of its own (_in_a_thread says why)."""
    global _mtq
    if _mtq is None:
        _mtq = _in_a_thread(_import_modelopt)
    return _mtq


def _import_modelopt():
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq

    return mtq, mto


def _in_a_thread(call):
    """call() in a thread of its own: its result, or its exception raised here.

    ModelOpt imports pulp, which keeps the ImportError of every solver it lacks, traceback included,
    for the life of the process; a traceback's frames hold their callers' frames, locals and all.
    Imported on a stage's stack, that kept the model of the first stage that imported ModelOpt
    (in a shared worker, the first variant's quantized model: a whole model of memory) until the
    process ended. A thread's stack holds nothing of the caller's."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # raised again in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="trtbuild-import")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def check_quant(quant: Optional[str], kv_cache: Optional[str]) -> None:
    if quant is not None and quant not in FORMATS:
        raise InvalidInput(f"quantization {quant!r}: expected one of {', '.join(FORMATS)}")
    if kv_cache is not None and kv_cache not in KV_FORMATS:
        raise InvalidInput(f"kv_cache {kv_cache!r}: expected one of {', '.join(KV_FORMATS)}")
    if quant is None and kv_cache is None:
        raise InvalidInput("nothing to quantize: neither a quantization nor a kv_cache format")


def needs_cuda(quant: Optional[str], kv_cache: Optional[str]) -> Optional[str]:
    """Why this combination cannot be calibrated on a CPU, or None when it can. Cheap: no import."""
    if quant is not None or kv_cache is not None:
        check_quant(quant, kv_cache)
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
    check_quant(quant, kv_cache)
    if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool)
                                   or group_size < 1):
        raise InvalidInput(f"group_size must be a positive integer, got {group_size!r}")
    mtq, _ = modelopt_modules()
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
