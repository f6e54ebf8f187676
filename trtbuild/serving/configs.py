"""What a Hugging Face (ModelOpt) checkpoint's configs say, as each runtime reads them: the two
quantization configs (`hf_quant_config.json`, `config.json`'s `quantization_config`) normalized,
where they diverge, which one each runtime uses, the modules the architecture builds (their names
and Linear shapes) and each runtime's rule for matching `exclude_modules` patterns against them.
Only JSON and safetensors headers are read (trtllm.md section 10 of the shared reference; the
runtimes' sources are cited at each rule)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from trtbuild.checkpoint.safetensors_files import read_safetensors_header, weight_files
from trtbuild.errors import InvalidInput
from trtbuild.model.config import read_json_object

FLOAT_CODES = ("BF16", "F16", "F32")


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


@dataclass
class Checkpoint:
    folder: Path
    config: dict
    file: Optional[QuantView]
    inline: Optional[QuantView]
    tensors: dict[str, dict]
    modules: list[str]


def read_checkpoint(folder: Path) -> Checkpoint:
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
    return Checkpoint(folder, config, file_view, inline_view, tensors, module_names(list(tensors) + built))


def chosen_view(runtime: str, ck: Checkpoint) -> Optional[QuantView]:
    if runtime == "trtllm":  # the file wins when it sets a global quant_algo (trtllm.md section 10)
        if ck.file is not None and ck.file.algo is not None:
            return ck.file
        return ck.inline
    return ck.inline if ck.inline is not None else ck.file  # config.json first (vLLM get_quant_config, SGLang likewise)


