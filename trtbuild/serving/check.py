"""Would a runtime's own loader accept this Hugging Face (ModelOpt) checkpoint, and on which GPUs?

The rules are the ones TensorRT-LLM's PyTorch backend, vLLM and SGLang apply to
`hf_quant_config.json`, `config.json`'s `quantization_config` and the weights, read from their
source: the accepted algorithm names and the per-SM verdicts are the runtime table's
(trtbuild/data/runtime-support.json, each cell citing its upstream file and commit; docs/runtimes.md);
the config precedence and TensorRT-LLM's lists are the shared reference's trtllm.md sections 3 and
10, the tensor layouts ModelOpt 0.47 exports its modelopt.md section 4. Only JSON and safetensors
headers are read: no torch, no data.

Per runtime: which of the two configs wins (and a warning when they diverge), the accepted
`quant_algo` / `kv_cache_quant_algo` names, `exclude_modules` patterns matched against the real
module names with that runtime's matching rule, group sizes, the tensors each quantized linear
must hold (dtype and shape), tied embeddings and an unquantized `lm_head` where vLLM needs one.
The per-SM verdicts come from the serving support table (trtbuild.facts.serving).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from trtbuild.errors import InvalidInput
from trtbuild.facts import serving
from trtbuild.facts.quantformats import NVFP4_BLOCK, TRTLLM_DEFAULT_GROUP_SIZE
from trtbuild.facts.serving import RUNTIME_INFO, RUNTIME_LABELS, RUNTIME_NAMES, RUNTIMES
from trtbuild.serving.configs import FILE, INLINE, MATCHERS, Checkpoint, QuantView, chosen_view, divergences, read_checkpoint
from trtbuild.serving.tensors import PER_GROUP, defects, tensor_findings

# The loader judges of each runtime and the verdict; what the configs say is serving/configs.py, the
# tensors' findings and defects serving/tensors.py.
# Every runtime's accepted quant_algo / kv_cache_quant_algo names (and the names TensorRT-LLM parses
# without a linear method) are the runtime table's `loaders` rows (serving.loader_algos, known_algos), per version.

SupportFn = Callable[[str, Optional[str], Optional[str], str, str], object]  # (runtime, quant, kv, sm, version)


class RuntimeCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    accepted: bool
    version: str  # the runtime table's version entry the verdict is for ("0.33.0")
    config_source: Optional[str] = None  # the file whose quantization config the runtime uses
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    sms: dict[str, str] = Field(default_factory=dict)  # sm -> "serves" | "serves (note)" | why not


class ServingCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal[2] = Field(2, alias="schema")  # 2: `defects`, and each runtime's `version`
    folder: str
    quant_algo: Optional[str] = None  # as the runtimes that read config.json see it
    kv_cache_quant_algo: Optional[str] = None
    # trtbuild's own integrity findings, whatever a loader does with them: a tensor missing, of the
    # wrong dtype or shape, a scale a loader silently defaults. Any defect: not fit to serve.
    defects: list[str] = Field(default_factory=list)
    runtimes: dict[str, RuntimeCheck]

    @property
    def accepted(self) -> bool:
        return not self.defects and all(r.accepted for r in self.runtimes.values())

    def as_json(self) -> dict:
        return self.model_dump(by_alias=True)

    def serves(self) -> dict[str, list[str]]:
        """{runtime: [sm, ...]}: the SMs each accepting runtime serves the checkpoint on (what the
        lock, `ls` and `pull` read)."""
        return {runtime: [sm for sm, verdict in r.sms.items() if verdict.startswith("serves")]
                for runtime, r in self.runtimes.items() if r.accepted}

    def lines(self) -> list[str]:
        """One line per defect, runtime verdict, reason and warning (what `trtbuild check` prints)."""
        out = [f"defect: {d}" for d in self.defects]
        for runtime, r in self.runtimes.items():
            label = RUNTIME_LABELS[runtime] if r.version == RUNTIME_INFO[runtime].default else \
                f"{runtime}=={r.version}"
            if r.accepted:
                serving = [sm + (verdict[len("serves"):] if verdict != "serves" else "")
                           for sm, verdict in r.sms.items() if verdict.startswith("serves")]
                out.append(f"{label}: accepted; serves {', '.join(serving)}")
            else:
                out += [f"{label}: rejected: {reason}" for reason in r.reasons]
            out += [f"{label}: warning: {w}" for w in r.warnings]
        return out


def _loader_problems(runtime: str, view: Optional[QuantView], ck: Checkpoint, version: Optional[str] = None
                     ) -> tuple[list[str], Optional[int], bool]:
    """The config-level reasons this runtime's loader rejects `view`; the group size it uses; and
    whether the loader stops there (an unaccepted quant_algo: it raises before reading a tensor)."""
    if view is None:
        return [], None, False
    src = view.source
    reasons: list[str] = []
    algo = view.algo
    if algo is None or algo == "":
        if runtime == "vllm":
            reasons.append(f"{src}: quant_algo missing (vLLM: \"Missing 'quant_algo' in quantization config\")")
        elif runtime == "sglang":
            reasons.append(f"{src}: quant_algo missing (SGLang: \"Cannot find 'quant_algo' in the model's "
                           "quantization config\")")
    elif runtime == "trtllm":
        if algo not in serving.known_algos(runtime, version):
            reasons.append(f"{src}: quant_algo {algo!r} is not a TensorRT-LLM QuantAlgo (ValueError)")
        elif algo not in serving.loader_algos(runtime, version)[0]:
            reasons.append(f"{src}: quant_algo {algo!r} has no linear method on the PyTorch backend "
                           "('unsupported quant mode')")
    elif runtime == "vllm":
        accepted = serving.loader_algos("vllm", version)[0]
        if str(algo).upper() not in accepted:
            reasons.append(f"{src}: quant_algo {algo!r} is not accepted by vLLM's ModelOpt loader "
                           f"(ModelOpt currently only supports: {list(accepted)})")
    elif algo not in serving.loader_algos("sglang", version)[0]:  # sglang compares the name as written
        reasons.append(f"{src}: quant_algo {algo!r} is not accepted by SGLang (\"ModelOptFp8Config only supports "
                       f"regular FP8 quantization, but found {algo!r}\")")
    if reasons:
        return reasons, None, True

    kv = view.kv_algo
    kv_names = serving.loader_algos(runtime, version)[1]
    if kv is not None:
        if not isinstance(kv, str):
            reasons.append(f"{src}: kv_cache_quant_algo must be a string, found {kv!r}")
        elif runtime != "vllm" and kv not in kv_names:  # vLLM: a warning (vllm_kv_warning)
            reasons.append(f"{src}: kv_cache_quant_algo {kv!r} is not one of {', '.join(kv_names)} "
                           f"({RUNTIME_NAMES[runtime]})")

    if not isinstance(view.exclude, list) or not all(isinstance(p, str) for p in view.exclude):
        reasons.append(f"{src}: {view.exclude_field} must be a list of strings, found {view.exclude!r}")
    else:
        matches = MATCHERS[runtime]
        for pattern in view.exclude:
            if not any(matches(m, pattern) for m in ck.modules):
                reasons.append(f"{src}: {view.exclude_field} pattern {pattern!r} matches no module of the checkpoint "
                               f"({RUNTIME_NAMES[runtime]} matching)")

    group: Optional[int] = None
    if algo in PER_GROUP or algo == "NVFP4":
        raw = view.group_size
        if raw is None:
            if algo == "NVFP4":
                group = NVFP4_BLOCK
            elif runtime == "trtllm":
                group = TRTLLM_DEFAULT_GROUP_SIZE  # QuantConfig's default when the config has none
            else:
                reasons.append(f"{src}: group_size missing for {algo}")
        elif isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
            reasons.append(f"{src}: group_size must be a positive integer, found {raw!r}")
        else:
            group = raw
    if runtime == "vllm" and algo == "NVFP4" and view.source == FILE:
        missing = [f for f in ("group_size", "kv_cache_quant_algo", "exclude_modules") if f not in view.raw]
        if missing:
            reasons.append(f"{src}: NVFP4 needs {', '.join(missing)} (vLLM ModelOptNvFp4Config)")
    return reasons, group, False


def vllm_kv_warning(view: Optional[QuantView], version: str) -> Optional[str]:
    """vLLM takes any kv_cache_quant_algo string (ModelOptQuantConfigBase.from_config, vllm v0.33.0
    modelopt.py l.368-377); one it has no KV cache dtype for is logged and the KV cache stays in the
    model dtype (get_kv_cache_quant_algo_string, utils/torch_utils.py l.443: "Falling back to 'auto'")."""
    kv = view.kv_algo if view is not None else None
    if isinstance(kv, str) and kv.upper() not in serving.loader_algos("vllm", version)[1]:
        return (f"{view.source}: kv_cache_quant_algo {kv!r} is not a KV cache dtype vLLM knows "
                f"({', '.join(serving.loader_algos('vllm', version)[1])}): vLLM logs \"Unknown kv_cache_quant_algo\" "
                "and keeps the KV cache unquantized, in the model dtype")
    return None


def _format_name(algo: Optional[str]) -> Optional[str]:
    """trtbuild's format name of a ModelOpt quant_algo (the support table is keyed by it)."""
    from trtbuild.facts.quantformats import FORMATS

    if algo is None:
        return None
    return next((name for name, f in FORMATS.items() if f.quant_algo == algo), algo.lower())


def _kv_name(kv) -> Optional[str]:
    from trtbuild.facts.quantformats import KV_FORMATS

    if not isinstance(kv, str):
        return None
    return next((name for name, f in KV_FORMATS.items() if f.quant_algo == kv), kv.lower())


def _default_support(runtime: str, quant: Optional[str], kv_cache: Optional[str], sm: str,
                     version: Optional[str] = None):
    return serving.support(runtime, quant, kv_cache, sm, version)


@dataclass(frozen=True)
class _Unlisted:
    """A format the support table has no row for (an algo or KV name trtbuild does not build)."""

    reason: str
    serves: bool = False
    note: Optional[str] = None


def _cell(support: SupportFn, runtime: str, algo: Optional[str], kv, sm: str, version: str):
    from trtbuild.facts.quantformats import FORMATS, KV_FORMATS

    quant, kv_cache = _format_name(algo), _kv_name(kv)
    if quant is not None and quant not in FORMATS:
        return _Unlisted(f"quant_algo {algo!r} is not in the serving support table")
    if kv_cache is not None and kv_cache not in KV_FORMATS:
        return _Unlisted(f"kv_cache_quant_algo {kv!r} is not in the serving support table")
    return support(runtime, quant, kv_cache, sm, version)


def _sm_verdict(cell) -> str:
    if cell.serves:
        return f"serves ({cell.note})" if getattr(cell, "note", None) else "serves"
    return str(cell.reason)


def check_checkpoint(folder: Path, runtimes: Sequence[str] = RUNTIMES, sms: Optional[Sequence[str]] = None,
                     support: Optional[SupportFn] = None) -> ServingCheck:
    """Every asked runtime's verdict on the checkpoint in `folder`. A runtime is a name (the runtime
    table's default version) or NAME==VERSION, a version the table covers. It accepts when its
    loader rules find nothing and the support table says it serves the format on every SM in
    `sms` (when given) or on at least one SM (when not)."""
    from trtbuild.facts.gpus import SM_ARCHES

    versions = dict(serving.parse_runtime(spec) for spec in runtimes)  # InvalidInput: one line
    asked_sms = list(sms) if sms else list(SM_ARCHES)
    bad_sm = [s for s in asked_sms if s not in SM_ARCHES]
    if bad_sm:
        raise InvalidInput(f"gpu {bad_sm[0]!r}: expected one of {', '.join(SM_ARCHES)}")
    asked_sms = [sm for sm in SM_ARCHES if sm in asked_sms]  # the table's order, once each
    support = support or _default_support
    ck = read_checkpoint(Path(folder))
    diverged = divergences(ck.file, ck.inline) if ck.file is not None and ck.inline is not None else []
    results: dict[str, RuntimeCheck] = {}
    for runtime, version in versions.items():
        view = chosen_view(runtime, ck)
        reasons, group, fatal = _loader_problems(runtime, view, ck, version)
        warnings = []
        if not fatal:
            findings = tensor_findings(runtime, view, group, ck)
            reasons += [f.line for f in findings if runtime != "vllm" or f.vllm_refuses]
            if runtime == "vllm":  # what it loads anyway and the user should know (the defects name each tensor)
                warnings += list(dict.fromkeys(f.vllm_does for f in findings
                                               if not f.vllm_refuses and f.vllm_does and "KV scale" in f.vllm_does))
                warnings += [f.line for f in findings if not f.vllm_refuses and not f.defect]
        kv_warning = vllm_kv_warning(view, version) if runtime == "vllm" and not fatal else None
        if kv_warning:
            warnings.append(kv_warning)
        if diverged:
            used = view.source if view is not None else FILE
            warnings.append(f"{INLINE} diverges from {FILE} ({'; '.join(diverged)}); "
                            f"{RUNTIME_NAMES[runtime]} uses {used}")
        algo = view.algo if view is not None and isinstance(view.algo, str) else None
        kv = view.kv_algo if view is not None else None
        if kv_warning:
            kv = None  # vLLM serves it with an unquantized KV cache
        cells = {sm: _cell(support, runtime, algo, kv, sm, version) for sm in asked_sms}
        verdicts = {sm: _sm_verdict(c) for sm, c in cells.items()}
        serving_sms = [sm for sm, c in cells.items() if c.serves]
        if reasons:  # the loader refuses it: no SM matters
            pass
        elif sms:
            reasons += [f"{sm}: {verdicts[sm]}" for sm, c in cells.items() if not c.serves]
        elif not serving_sms:
            reasons.append(f"no GPU: {next(iter(verdicts.values()))}")
        results[runtime] = RuntimeCheck(accepted=not reasons, version=version, config_source=view.source if view else None,
                                        reasons=reasons, warnings=warnings, sms=verdicts)
    first = chosen_view("vllm", ck)
    return ServingCheck(folder=str(folder), quant_algo=first.algo if first else None,
                        kv_cache_quant_algo=first.kv_algo if first and isinstance(first.kv_algo, str) else None,
                        defects=defects(ck), runtimes=results)
