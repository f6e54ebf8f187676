"""Which runtime serves which Hugging Face (ModelOpt) checkpoint on which GPU: one fact per
(runtime, weight format, KV-cache format, SM), each citing reference/serving.md.

Conservative by rule: a cell serving.md marks "not read" / "not verified" / "inferred without a
kernel" is not claimed (serves False, the reason says "not claimed" and why); a `Y*` cell (a
fallback kernel) serves with a note. Plain data, no torch or numpy: `plan` and `pullselect` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from trtbuild import hardware, quantformats

TABLE_VERSION = 1  # bumped whenever a fact changes: hf-checkpoint keys record it


@dataclass(frozen=True)
class Runtime:
    name: str  # "trtllm"
    label: str  # as plan / ls text writes it: "trtllm>=1.3"
    package: str  # the distribution whose metadata says it is installed
    version: str  # the pinned version spec the facts were read at
    text: str  # for people


RUNTIME_INFO: dict[str, Runtime] = {r.name: r for r in (
    Runtime("trtllm", "trtllm>=1.3", "tensorrt_llm", ">=1.3", "TensorRT-LLM's PyTorch backend"),
    Runtime("vllm", "vllm", "vllm", "==0.33.0", "vLLM"),
    Runtime("sglang", "sglang", "sglang", "==0.5.23", "SGLang"),
)}
RUNTIMES = tuple(RUNTIME_INFO)


@dataclass(frozen=True)
class Support:
    runtime: str
    sm: str
    serves: bool
    note: Optional[str] = None  # serves, on a fallback: what to know
    reason: Optional[str] = None  # does not serve (or not claimed): one clause
    cite: str = ""  # the serving.md section that settles it


_ALL = frozenset(hardware.SM_ARCHES)
_AMPERE = frozenset({"sm80", "sm86"})
_ADA_ON = frozenset({"sm89", "sm90", "sm100", "sm120"})
_BLACKWELL = frozenset({"sm100", "sm120"})
_BEFORE_BLACKWELL = _ALL - _BLACKWELL


@dataclass(frozen=True)
class _Cells:
    """One (runtime, format) row: the SMs that serve, those on a fallback, those not claimed; any
    other SM does not serve, for `reason`."""

    cite: str
    serves: frozenset = frozenset()
    reason: Optional[str] = None
    fallback: frozenset = frozenset()
    fallback_note: Optional[str] = None
    unclaimed: frozenset = frozenset()
    unclaimed_why: Optional[str] = None

    def at(self, runtime: str, sm: str) -> Support:
        if sm in self.serves:
            return Support(runtime, sm, True, cite=self.cite)
        if sm in self.fallback:
            return Support(runtime, sm, True, note=self.fallback_note, cite=self.cite)
        if sm in self.unclaimed:
            return Support(runtime, sm, False, reason=f"not claimed: {self.unclaimed_why}", cite=self.cite)
        return Support(runtime, sm, False, reason=self.reason, cite=self.cite)


_S1 = "serving.md section 1 (TensorRT-LLM PyTorch backend: GPU support)"
_S1_LINEAR = "serving.md section 1 (TensorRT-LLM PyTorch backend: linear methods)"
_S2 = "serving.md section 2 (vLLM 0.33.0: accepted quant_algo, min capability, Marlin)"
_S3 = "serving.md section 3 (SGLang 0.5.23: method per algo, min capability)"
_S0 = "serving.md section 0 (proposed support table)"
_NOT_VERIFIED = "serving.md 'Not verified'"

_VLLM_ACCEPTS = "FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8, MIXED_PRECISION"


def _vllm_rejects(algo: str) -> _Cells:
    # vllm/model_executor/layers/quantization/modelopt.py QUANT_ALGOS, from_config's ValueError
    return _Cells(_S2, reason=f"its ModelOpt loader rejects quant_algo {algo} (it accepts {_VLLM_ACCEPTS})")


def _sglang_rejects(algo: str) -> _Cells:
    # srt/layers/modelopt_utils.py _MODELOPT_QUANT_ALGO_TO_METHOD has no entry; ModelOptFp8Config.from_config raises
    return _Cells(_S3, reason=f"quant_algo {algo} maps to no ModelOpt method "
                              "('ModelOptFp8Config only supports regular FP8 quantization')")


_TRTLLM_W4A16 = _Cells(  # docs/source/features/quantization.md Hardware Support Matrix: Ampere, Ada, Hopper
    _S1, serves=_BEFORE_BLACKWELL, reason="the support matrix has no W4A16 AWQ on Blackwell (sm100, sm120)")

# (runtime, quant) -> cells. quant None: the unquantized (bf16/fp16) export.
_WEIGHTS: dict[tuple[str, Optional[str]], _Cells] = {
    # ---- TensorRT-LLM PyTorch backend: tensorrt_llm/_torch/modules/linear.py get_quant_method and the
    # Hardware Support Matrix of docs/source/features/quantization.md (sm86 read as Ampere, sm89 as Ada)
    ("trtllm", None): _Cells(_S0, serves=_ALL),
    ("trtllm", "fp8"): _Cells(_S1, serves=_ADA_ON, reason="the support matrix has no FP8 on Ampere (sm80, sm86)"),
    ("trtllm", "int8_sq"): _Cells(_S1_LINEAR, reason="no linear method for INT8 SmoothQuant (W8A8_SQ_PER_CHANNEL): "
                                                     "'unsupported quant mode'"),
    ("trtllm", "int4_awq"): _TRTLLM_W4A16,
    ("trtllm", "int4_wo"): _TRTLLM_W4A16,  # exported as W4A16_AWQ (quantformats.py): the same loader path
    ("trtllm", "w4a8_awq"): _Cells(_S1, serves=frozenset({"sm89", "sm90"}),
                                   reason="the support matrix has W4A8 AWQ on Ada and Hopper only (sm89, sm90)"),
    ("trtllm", "int8_wo"): _Cells(_S1, unclaimed=_ALL, unclaimed_why=(
        "the loader reads W8A16 (WeightOnlyQuantLinearMethod), but INT8 weight-only is outside the support "
        "matrix and its SM range was not read")),
    ("trtllm", "nvfp4"): _Cells(_S1, serves=_BLACKWELL, reason="the support matrix has NVFP4 on Blackwell only (sm100, sm120)"),
    # ---- vLLM 0.33.0: model_executor/layers/quantization/modelopt.py (QUANT_ALGOS, get_min_capability),
    # model_executor/kernels/linear/__init__.py (_POSSIBLE_FP8_KERNELS, _POSSIBLE_NVFP4_KERNELS)
    ("vllm", None): _Cells(_S0, serves=_ALL),
    ("vllm", "fp8"): _Cells(_S2, serves=_ADA_ON, fallback=_AMPERE,
                            fallback_note="Marlin FP8 fallback: weight-only compute (inferred)"),
    ("vllm", "int8_sq"): _vllm_rejects("W8A8_SQ_PER_CHANNEL"),
    ("vllm", "int4_awq"): _vllm_rejects("W4A16_AWQ"),
    ("vllm", "int4_wo"): _vllm_rejects("W4A16_AWQ"),
    ("vllm", "w4a8_awq"): _vllm_rejects("W4A8_AWQ"),
    ("vllm", "int8_wo"): _vllm_rejects("W8A16"),
    ("vllm", "nvfp4"): _Cells(_S2, serves=_BLACKWELL, fallback=_BEFORE_BLACKWELL,
                              fallback_note="Marlin NVFP4 fallback: weight-only W4A16 compute (inferred)"),
    # ---- SGLang 0.5.23: srt/layers/quantization/modelopt_quant.py (get_min_capability),
    # srt/layers/modelopt_utils.py, srt/configs/model_config.py _parse_modelopt_quant_config
    ("sglang", None): _Cells(_S0, serves=_ALL),
    ("sglang", "fp8"): _Cells(_S3, serves=_ADA_ON, reason="ModelOptFp8Config needs compute capability 89"),
    ("sglang", "int8_sq"): _sglang_rejects("W8A8_SQ_PER_CHANNEL"),
    ("sglang", "int4_awq"): _sglang_rejects("W4A16_AWQ"),
    ("sglang", "int4_wo"): _sglang_rejects("W4A16_AWQ"),
    ("sglang", "w4a8_awq"): _sglang_rejects("W4A8_AWQ"),
    ("sglang", "int8_wo"): _sglang_rejects("W8A16"),
    ("sglang", "nvfp4"): _Cells(_S3, serves=_BLACKWELL, unclaimed=_BEFORE_BLACKWELL, unclaimed_why=(
        "below sm100 NVFP4 passes ModelOptFp4Config's capability-80 gate, but its kernel path was not read")),
}

_KV_ONLY = ("a KV-cache-only export (kv_cache_quant_algo without a quant_algo) is not in serving.md's table")
_NVFP4_KV = "an NVFP4 KV cache in a ModelOpt checkpoint is not in serving.md's table"

# (runtime, kv_cache) -> cells, for a checkpoint whose weights are quantized (see _KV_ONLY otherwise).
_KV: dict[tuple[str, str], _Cells] = {
    # quantization.md: FP8 KV is in the matrix on every architecture
    ("trtllm", "fp8"): _Cells(_S1, serves=_ALL),
    ("vllm", "fp8"): _Cells(_NOT_VERIFIED, serves=_ADA_ON, unclaimed=_AMPERE,
                            unclaimed_why="FP8 KV cache on sm80/sm86 attention backends is not verified"),
    ("sglang", "fp8"): _Cells(_S0, serves=_ADA_ON, unclaimed=_AMPERE,
                              unclaimed_why="SGLang's FP8 KV cache on sm80/sm86 was not read"),
    **{(r, "nvfp4"): _Cells(_S0, unclaimed=_ALL, unclaimed_why=_NVFP4_KV) for r in RUNTIMES},
}


def support(runtime: str, quant: Optional[str], kv_cache: Optional[str], sm: str) -> Support:
    """Whether `runtime` serves the export of (quant, kv_cache) on `sm`, and why (not)."""
    if runtime not in RUNTIME_INFO:
        raise ValueError(f"unknown runtime {runtime!r}; one of {', '.join(RUNTIMES)}")
    if sm not in hardware.SM_ARCHES:
        raise ValueError(f"unknown SM {sm!r}; one of {', '.join(hardware.SM_ARCHES)}")
    if kv_cache is not None and not quantformats.KV_FORMATS[kv_cache].hf_export:
        return Support(runtime, sm, False, reason=f"{quantformats.KV_FORMATS[kv_cache].label} has no Hugging Face "
                                                  "checkpoint form", cite="modelopt.md (export_hf_checkpoint)")
    if quant is None and kv_cache is not None:
        return Support(runtime, sm, False, reason=f"not claimed: {_KV_ONLY}", cite=_S0)
    weights = _WEIGHTS[(runtime, quant)].at(runtime, sm)
    if not weights.serves or kv_cache is None:
        return weights
    kv = _KV[(runtime, kv_cache)].at(runtime, sm)
    if not kv.serves:
        return kv
    notes = [n for n in (weights.note, kv.note) if n]
    return Support(runtime, sm, True, note="; ".join(notes) or None, cite=weights.cite)


def _sorted(sms: Sequence[str]) -> list[str]:
    return sorted(dict.fromkeys(sms), key=hardware.sm_number)


def serving_sms(runtime: str, quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> list[str]:
    """The SMs of `sms` on which `runtime` serves (quant, kv_cache), in SM order."""
    return [sm for sm in _sorted(sms) if support(runtime, quant, kv_cache, sm).serves]


def serves_text(quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> str:
    """`trtllm>=1.3 sm89 sm90; vllm sm89 sm90`, or `none`."""
    parts = []
    for runtime in RUNTIMES:
        serving = serving_sms(runtime, quant, kv_cache, sms)
        if serving:
            parts.append(" ".join([RUNTIME_INFO[runtime].label, *serving]))
    return "; ".join(parts) or "none"


def served_text(serves: dict[str, Sequence[str]]) -> str:
    """The same line from {runtime: [sm, ...]} (a loader check's verdict, as the lock keeps it)."""
    parts = [" ".join([RUNTIME_INFO[r].label, *_sorted(serves[r])]) for r in RUNTIMES if serves.get(r)]
    return "; ".join(parts) or "none"


def serve_notes(quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> dict[str, dict[str, str]]:
    """{runtime: {sm: note}} for the SMs of `sms` served on a fallback."""
    notes: dict[str, dict[str, str]] = {}
    for runtime in RUNTIMES:
        for sm in _sorted(sms):
            s = support(runtime, quant, kv_cache, sm)
            if s.serves and s.note:
                notes.setdefault(runtime, {})[sm] = s.note
    return notes


def format_label(quant: Optional[str], kv_cache: Optional[str]) -> str:
    """`INT8 SmoothQuant`, `FP8 with an FP8 KV cache`, `unquantized weights`."""
    weights = quantformats.FORMATS[quant].label if quant else "unquantized weights"
    return weights + (f" with {quantformats.KV_FORMATS[kv_cache].label}" if kv_cache else "")


def unservable_reason(quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> Optional[str]:
    """None when some runtime serves (quant, kv_cache) on some SM of `sms`; else each runtime's reason:
    `no runtime serves INT8 SmoothQuant on sm89, sm90: trtllm>=1.3: ...; vllm: ...; sglang: ...`. A
    runtime whose reason differs by SM lists them: `sm80 sm86: ... / sm100: ...`."""
    ordered = _sorted(sms)
    parts = []
    for runtime in RUNTIMES:
        by_reason: dict[str, list[str]] = {}
        for sm in ordered:
            s = support(runtime, quant, kv_cache, sm)
            if s.serves:
                return None
            by_reason.setdefault(s.reason or "", []).append(sm)
        if len(by_reason) == 1:
            text = next(iter(by_reason))
        else:
            text = " / ".join(f"{' '.join(group)}: {reason}" for reason, group in by_reason.items())
        parts.append(f"{RUNTIME_INFO[runtime].label}: {text}")
    return f"no runtime serves {format_label(quant, kv_cache)} on {', '.join(ordered)}: " + "; ".join(parts)
