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

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from trtbuild.checkpoint.safetensors_files import read_safetensors_header, weight_files
from trtbuild.errors import InvalidInput
from trtbuild.model.config import read_json_object

from trtbuild.facts import serving
from trtbuild.facts.serving import RUNTIME_INFO, RUNTIME_LABELS, RUNTIME_NAMES, RUNTIMES

FLOAT_CODES = ("BF16", "F16", "F32")
PER_GROUP = ("W4A16_AWQ", "W4A8_AWQ")

# TensorRT-LLM: every QuantAlgo member parses (trtllm.md section 3 in the project's shared reference);
# these have a linear method in `_torch/modules/linear.py` `get_quant_method` (the runtime table's
# source trtllm-linear; the rest: "unsupported quant mode").
TRTLLM_QUANT_ALGOS = ("W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W8A16_GPTQ", "W4A16_GPTQ", "W8A8_SQ_PER_CHANNEL",
                      "W8A8_SQ_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
                      "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN",
                      "W4A8_QSERVE_PER_GROUP", "W4A8_QSERVE_PER_CHANNEL", "FP8", "FP8_PER_CHANNEL_PER_TOKEN",
                      "FP8_BLOCK_SCALES", "INT8", "MIXED_PRECISION", "NVFP4", "W4A8_NVFP4_FP8", "W4A8_MXFP4_FP8",
                      "W4A8_MXFP4_MXFP8", "W4A16_MXFP4", "NO_QUANT")
TRTLLM_LINEAR_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_BLOCK_SCALES", "NVFP4", "W4A8_NVFP4_FP8",
                       "W4A8_MXFP4_FP8", "W8A16", "W4A16", "W4A16_AWQ", "W4A8_AWQ", "W4A8_MXFP4_MXFP8",
                       "MIXED_PRECISION")
TRTLLM_KV_ALGOS = ("FP8", "INT8", "NVFP4")  # KV_CACHE_QUANT_ALGO_LIST (trtllm.md section 3)
TRTLLM_DEFAULT_GROUP_SIZE = 128  # QuantConfig.group_size's default (trtllm.md section 3)
# vLLM's and SGLang's accepted quant_algo / kv_cache_quant_algo names are the runtime table's
# `loaders` rows (serving.loader_algos), per version.

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


@dataclass(frozen=True)
class QuantView:
    """One quantization config, normalized: which file, and the fields the loaders read."""

    source: str  # "hf_quant_config.json" | "config.json quantization_config"
    algo: Optional[str]
    kv_algo: object
    group_size: object  # as written (validated per runtime)
    exclude: object  # list of patterns as written
    exclude_field: str  # the field's name, for messages
    raw: dict


FILE = "hf_quant_config.json"
INLINE = "config.json quantization_config"


def _file_view(data: dict) -> QuantView:
    q = data.get("quantization") if isinstance(data.get("quantization"), dict) else data
    return QuantView(FILE, q.get("quant_algo"), q.get("kv_cache_quant_algo"), q.get("group_size"),
                     q.get("exclude_modules", []), "quantization.exclude_modules", q)


def _inline_view(qc: dict) -> QuantView:
    if isinstance(qc.get("quantization"), dict):  # the nested form written inline
        view = _file_view(qc)
        return QuantView(INLINE, view.algo, view.kv_algo, view.group_size, view.exclude, view.exclude_field, qc)
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, dict):
        kv = "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else scheme
    else:
        kv = qc.get("kv_cache_quant_algo")
    field = "ignore" if "ignore" in qc else "exclude_modules"
    return QuantView(INLINE, qc.get("quant_algo"), kv, qc.get("group_size"), qc.get(field, []), field, qc)


def divergences(file: QuantView, inline: QuantView) -> list[str]:
    """The fields TensorRT-LLM compares (`_INVARIANT_FIELDS` of `_torch/model_config.py`, trtllm.md section 10) that differ."""
    out = []
    for name, a, b in (("quant_algo", file.algo, inline.algo), ("kv_cache_quant_algo", file.kv_algo, inline.kv_algo),
                       ("group_size", file.group_size, inline.group_size)):
        if a != b:
            out.append(f"{name} {_show(a)} in {FILE}, {_show(b)} inline")
    ea = sorted(file.exclude) if isinstance(file.exclude, list) else file.exclude
    eb = sorted(inline.exclude) if isinstance(inline.exclude, list) else inline.exclude
    if ea != eb:
        out.append(f"exclude_modules {_show(file.exclude)} in {FILE}, {inline.exclude_field} {_show(inline.exclude)} inline")
    return out


def _show(value) -> str:
    return "none" if value is None else repr(value)


# ---------------------------------------------------------------------------------------------
# Module names and exclusion matching


def module_names(tensors: Sequence[str]) -> list[str]:
    """Every module that owns a tensor, and their ancestors (a pattern may name a whole subtree)."""
    names = set()
    for tensor in tensors:
        parts = tensor.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            names.add(".".join(parts[:i]))
    return sorted(names)


def _trtllm_excluded(module: str, pattern: str) -> bool:
    # fnmatch-style wildcards against the full name (trtllm.md section 10)
    return fnmatch.fnmatchcase(module, pattern)


def _vllm_excluded(module: str, pattern: str) -> bool:
    # is_layer_excluded (vLLM v0.33.0 modelopt.py l.191; v0.26.0 l.145): exact, then substring (also without language_model.),
    # then fnmatch; a trailing `name*` also means `name` and `name.*` (apply_vllm_mapper).
    bare = module.removeprefix("language_model.")
    if module == pattern or pattern in module or pattern in bare:
        return True
    if len(pattern) >= 2 and pattern.endswith("*") and pattern[-2] != ".":
        stem = pattern[:-1]
        if module == stem or fnmatch.fnmatch(module, stem + ".*"):
            return True
    return fnmatch.fnmatch(module, pattern)


def _sglang_excluded(module: str, pattern: str) -> bool:
    # ModelOptQuantConfig.is_layer_excluded (SGLang 0.5.23 modelopt_quant.py l.379): the glob as a regex,
    # fullmatched against the prefix and each dotted part, also without language_model.
    regex = re.compile(pattern.replace(".", r"\.").replace("*", r".*"))
    for name in {module, module.removeprefix("language_model.")}:
        if regex.fullmatch(name) or any(regex.fullmatch(part) for part in name.split(".")):
            return True
    return False


MATCHERS: dict[str, Callable[[str, str], bool]] = {
    "trtllm": _trtllm_excluded, "vllm": _vllm_excluded, "sglang": _sglang_excluded,
    "defects": _vllm_excluded}  # the defects read the config vLLM reads (config.json first), with its matching


# ---------------------------------------------------------------------------------------------
# Expected tensors of one linear


@dataclass(frozen=True)
class Expect:
    dtype: Optional[tuple[str, ...]]  # accepted safetensors codes; None: any
    shape: Optional[tuple[int, ...]]  # None: not checked
    required: bool = True


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def expected_linear(algo: Optional[str], out_f: int, in_f: int, group: Optional[int], model_dtype: tuple[str, ...]
                    ) -> dict[str, Expect]:
    """suffix -> Expect for one linear of a ModelOpt 0.47 unified HF export (modelopt.md section 4;
    FP8 and NVFP4 as the vLLM/SGLang schemes read them: the runtime table's sources vllm-0.33-modelopt, sglang-modelopt)."""
    F32 = ("F32",)
    if algo is None:
        return {"weight": Expect(model_dtype, (out_f, in_f))}
    if algo == "FP8":
        return {"weight": Expect(("F8_E4M3",), (out_f, in_f)), "weight_scale": Expect(F32, ()),
                "input_scale": Expect(F32, ())}
    if algo == "NVFP4":
        return {"weight": Expect(("U8",), (out_f, in_f // 2)), "weight_scale": Expect(("F8_E4M3",), (out_f, in_f // 16)),
                "weight_scale_2": Expect(F32, ()), "input_scale": Expect(F32, ())}
    if algo in PER_GROUP:
        out = {"weight": Expect(("U8",), (out_f // 2, in_f)),
               "weight_scale": Expect(F32, (out_f, in_f // group) if group else None),
               # q/k/v and gate/up have theirs folded into the preceding norm by the export
               "pre_quant_scale": Expect(model_dtype, (in_f,), required=False)}
        if algo == "W4A8_AWQ":
            out.update(weight_scale_2=Expect(F32, ()), input_scale=Expect(F32, ()))
        return out
    if algo == "W8A16":
        return {"weight": Expect(("I8",), (out_f, in_f)), "weight_scale": Expect(F32, (out_f,))}
    if algo == "W8A8_SQ_PER_CHANNEL":
        return {"weight": Expect(("I8",), (out_f, in_f)), "weight_scale": Expect(F32, (out_f,)),
                "input_scale": Expect(F32, ()), "pre_quant_scale": Expect(model_dtype, (in_f,), required=False)}
    return {"weight": Expect(None, None)}  # a layout not read here: names only


def linear_shapes(config: dict, tensors: dict[str, dict]) -> dict[str, tuple[int, int]]:
    """module -> (out_features, in_features) of every Linear of a LLaMA-family model (and lm_head)."""
    from trtbuild.checkpoint.hf_layout import hf_layout

    L = hf_layout(config, "config.json")
    H, hd = L.hidden, L.head_dim
    out: dict[str, tuple[int, int]] = {}
    for i in range(L.num_layers):
        a = f"model.layers.{i}.self_attn."
        out[a + "q_proj"] = (L.heads * hd, H)
        out[a + "k_proj"] = (L.kv_heads * hd, H)
        out[a + "v_proj"] = (L.kv_heads * hd, H)
        out[a + "o_proj"] = (H, L.heads * hd)
        if L.num_experts:
            for e in range(L.num_experts):
                x = f"model.layers.{i}.block_sparse_moe.experts.{e}."
                out[x + "w1"], out[x + "w3"], out[x + "w2"] = (L.intermediate, H), (L.intermediate, H), (H, L.intermediate)
        else:
            m = f"model.layers.{i}.mlp."
            out[m + "gate_proj"], out[m + "up_proj"] = (L.intermediate, H), (L.intermediate, H)
            out[m + "down_proj"] = (H, L.intermediate)
    head = tensors.get("lm_head.weight")
    # AWQ exports pad the vocab (modelopt.md section 3): the head's rows are the file's
    vocab = L.vocab
    if head is not None and head.get("dtype") in FLOAT_CODES and len(head.get("shape", ())) == 2:
        vocab = int(head["shape"][0])
    out["lm_head"] = (vocab, H)
    return out


# ---------------------------------------------------------------------------------------------
# The check


@dataclass
class _Checkpoint:
    folder: Path
    config: dict
    file: Optional[QuantView]
    inline: Optional[QuantView]
    tensors: dict[str, dict]
    modules: list[str]


def _read(folder: Path) -> _Checkpoint:
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise InvalidInput(f"{folder}: not a Hugging Face checkpoint folder (no config.json)")
    config = read_json_object(folder / "config.json")
    file_view = None
    if (folder / FILE).is_file():
        file_view = _file_view(read_json_object(folder / FILE))
    qc = config.get("quantization_config")
    inline_view = _inline_view(qc) if isinstance(qc, dict) else None
    tensors: dict[str, dict] = {}
    for name in weight_files(folder):
        tensors.update(read_safetensors_header(folder / name))
    # The runtime builds every module of the architecture, also one without tensors of its own
    # (a tied lm_head): the names to match patterns against are both.
    try:
        built = [m + ".weight" for m in linear_shapes(config, tensors)]
    except InvalidInput:
        built = []
    return _Checkpoint(folder, config, file_view, inline_view, tensors, module_names(list(tensors) + built))


def _chosen(runtime: str, ck: _Checkpoint) -> Optional[QuantView]:
    if runtime == "trtllm":  # the file wins when it sets a global quant_algo (trtllm.md section 10)
        if ck.file is not None and ck.file.algo is not None:
            return ck.file
        return ck.inline
    return ck.inline if ck.inline is not None else ck.file  # config.json first (vLLM get_quant_config, SGLang likewise)


def _loader_problems(runtime: str, view: Optional[QuantView], ck: _Checkpoint, version: Optional[str] = None
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
        if algo not in TRTLLM_QUANT_ALGOS:
            reasons.append(f"{src}: quant_algo {algo!r} is not a TensorRT-LLM QuantAlgo (ValueError)")
        elif algo not in TRTLLM_LINEAR_ALGOS:
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
    kv_names = TRTLLM_KV_ALGOS if runtime == "trtllm" else serving.loader_algos(runtime, version)[1]
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
                group = 16
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


@dataclass(frozen=True)
class Finding:
    """One problem of the tensors (or of lm_head's config) as one runtime's rules see it."""

    line: str
    defect: bool  # the checkpoint is incomplete or wrong, whatever a loader does with it
    vllm_refuses: bool = True  # vLLM 0.33.0's loader raises on it (else: `vllm_does`, what it does instead)
    vllm_does: Optional[str] = None


VLLM_KV_DTYPES = ("FP8", "NVFP4")  # MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP (vllm v0.33.0 utils/torch_utils.py l.78)


def _vllm_missing(module: str, suffix: str, algo: Optional[str], tensors: dict) -> Optional[str]:
    """What vLLM 0.33.0's default load (`vllm serve` as packaged: no model-loader extra config) does
    instead of refusing a missing linear tensor `module.suffix`, or None when it refuses ("Following
    weights were not initialized from checkpoint"). By default it tracks the loaded weights of an
    unquantized model only (model_loader/default_loader.py, DefaultModelLoader.load_weights,
    l.510-518), and there it exempts every module with a quant_method, which the linear layers have
    (track_weights_loading, l.540-565): so a missing linear tensor is never refused."""
    if algo is None:
        return "vLLM 0.33.0 loads the model with it uninitialised: its loaded-weights check exempts an unquantized model's linear layers"
    return ("vLLM 0.33.0 loads the layer with it uninitialised: by default it checks the loaded weights of unquantized "
            "models only")


def _tensor_findings(runtime: str, view: Optional[QuantView], group: Optional[int], ck: _Checkpoint
                     ) -> list[Finding]:
    algo = view.algo if view is not None and isinstance(view.algo, str) else None
    patterns = view.exclude if view is not None and isinstance(view.exclude, list) else []
    patterns = [p for p in patterns if isinstance(p, str)]
    matches = MATCHERS[runtime]
    tensors = ck.tensors
    embed = tensors.get("model.embed_tokens.weight", {})
    model_dtype = (embed["dtype"],) if embed.get("dtype") in FLOAT_CODES else FLOAT_CODES
    tied = bool(ck.config.get("tie_word_embeddings", False))
    problems: list[Finding] = []
    try:
        shapes = linear_shapes(ck.config, tensors)
    except InvalidInput as exc:
        return [Finding(f"tensors not checked: {exc}", defect=False)]

    for module, (out_f, in_f) in shapes.items():
        excluded = algo is None or any(matches(module, p) for p in patterns)
        module_algo = None if excluded else algo
        if module == "lm_head" and module_algo is not None:
            if tied:
                problems.append(Finding(
                    f"config.json: tie_word_embeddings is true, so lm_head is model.embed_tokens, which is "
                    f"not quantized, but {view.exclude_field} does not exclude lm_head", defect=False))
                continue
            if runtime == "vllm":
                # vLLM 0.33.0 loads it (its default load tracks no weight of a quantized model), with
                # lm_head quantized, which vLLM #45102 says to avoid: a warning, since the other
                # runtimes serve the same checkpoint as it is meant
                problems.append(Finding(
                    f"{view.source}: {view.exclude_field} does not exclude lm_head: vLLM would quantize "
                    f"its ParallelLMHead as {algo} (keep lm_head unquantized: vLLM #45102)", defect=False,
                    vllm_refuses=False))
        if module_algo in PER_GROUP and group and in_f % group:
            problems.append(Finding(f"{view.source}: group_size {group} does not divide {module}'s in_features {in_f}",
                                    defect=False))
            group_for = None
        else:
            group_for = group
        want = expected_linear(module_algo, out_f, in_f, group_for, model_dtype)
        head_optional = module == "lm_head" and tied
        for suffix, exp in want.items():
            name = f"{module}.{suffix}"
            info = tensors.get(name)
            if info is None:
                if exp.required and not head_optional:
                    what = " ".join(x for x in ("/".join(exp.dtype) if exp.dtype else None,
                                                _fmt(exp.shape) if exp.shape is not None else None) if x)
                    does = _vllm_missing(module, suffix, algo, tensors)
                    problems.append(Finding(f"{name} missing (expected {what}"
                                            f"{' for ' + module_algo if module_algo else ''})", defect=True,
                                            vllm_refuses=does is None, vllm_does=does))
                continue
            shape, dtype = tuple(info.get("shape", ())), info.get("dtype")
            if exp.dtype is not None and dtype not in exp.dtype:
                # vLLM's weight loaders copy_ the tensor into the parameter, converting its dtype
                problems.append(Finding(f"{name} dtype expected {'/'.join(exp.dtype)}, found {dtype}", defect=True,
                                        vllm_refuses=False,
                                        vllm_does=f"vLLM 0.33.0's weight loader would convert it to the parameter's dtype"))
            if exp.shape is not None and shape != exp.shape:
                problems.append(Finding(f"{name} shape expected {_fmt(exp.shape)}, found {_fmt(shape)}", defect=True))
        if module_algo is None:
            for suffix in ("weight_scale", "weight_scale_2", "input_scale"):
                if f"{module}.{suffix}" in tensors:
                    why = "excluded from quantization" if algo is not None else "the checkpoint is not quantized"
                    problems.append(Finding(f"{module}.{suffix} present but {module} is {why}: its weight is loaded as "
                                            "unquantized", defect=True))
    kv = view.kv_algo if view is not None else None
    # A quantized KV cache reads per-tensor k/v scales. Every runtime's reasons keep FP8's (its loaders read
    # them); the defects also name an INT8 KV cache's, which vLLM does not quantize (vllm_kv_warning).
    if kv in ("FP8", "INT8") and (kv == "FP8" or runtime == "defects"):
        for i in range(int(ck.config.get("num_hidden_layers", 0))):
            names = {scale: f"model.layers.{i}.self_attn.{proj}.{scale}" for proj, scale in (("k_proj", "k_scale"),
                                                                                           ("v_proj", "v_scale"))}
            absent = [scale for scale, name in names.items() if name not in tensors]
            for scale, name in names.items():
                info = tensors.get(name)
                if info is None:
                    # BaseKVCacheMethod.process_weights_after_loading (vllm v0.33.0 kv_cache.py l.113-140): both
                    # missing: scale 1.0; one missing: `assert layer.k_scale > 0.0` fails
                    both = len(absent) == 2 or kv == "INT8"  # vLLM keeps an INT8-declared KV cache unquantized
                    problems.append(Finding(
                        f"{name} missing (expected F32 [] for the {kv} KV cache)", defect=True,
                        vllm_refuses=not both,
                        vllm_does=f"vLLM 0.33.0 would use a KV scale of 1.0 for layer {i}"
                        if both and kv == "FP8" else None))
                elif info.get("dtype") != "F32" or tuple(info.get("shape", ())) != ():
                    problems.append(Finding(f"{name} expected F32 [], found {info.get('dtype')} "
                                            f"{_fmt(info.get('shape', ()))}", defect=True))
    return problems


def defects(ck: _Checkpoint) -> list[str]:
    """The checkpoint's integrity findings, runtime-independent (the config the runtimes that read
    config.json use; its group size as written), each saying what vLLM does with it when it loads it."""
    view = _chosen("vllm", ck)
    group = view.group_size if view is not None and isinstance(view.group_size, int) and view.group_size > 0 else None
    if view is not None and view.algo == "NVFP4" and group is None:
        group = 16
    return [f.line + (f" ({f.vllm_does})" if not f.vllm_refuses and f.vllm_does else "")
            for f in _tensor_findings("defects", view, group, ck) if f.defect]


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
    ck = _read(Path(folder))
    diverged = divergences(ck.file, ck.inline) if ck.file is not None and ck.inline is not None else []
    results: dict[str, RuntimeCheck] = {}
    for runtime, version in versions.items():
        view = _chosen(runtime, ck)
        reasons, group, fatal = _loader_problems(runtime, view, ck, version)
        warnings = []
        if not fatal:
            findings = _tensor_findings(runtime, view, group, ck)
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
    first = _chosen("vllm", ck)
    return ServingCheck(folder=str(folder), quant_algo=first.algo if first else None,
                        kv_cache_quant_algo=first.kv_algo if first and isinstance(first.kv_algo, str) else None,
                        defects=defects(ck), runtimes=results)
