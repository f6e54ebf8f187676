"""The runtime options of an hf-checkpoint, derived from the recipe (limits, KV cache, parallelism,
dtype, serving.memory_fraction): TensorRT-LLM's `extra_llm_api_options` YAML, vLLM's and SGLang's
command-line arguments, and a README with the exact serve command per runtime, written only for the
runtimes whose loader accepts the checkpoint (the others are named with the reason). What a runtime
must be told about the format (--quantization, the KV-cache dtype) is the runtime table's
(trtbuild/data/runtime-support.json, read through trtbuild.facts.serving).

Every option name and value is checked against the runtime's own argument list, read from its
source into trtbuild/data/ (trtllm-llm-api-options.json, vllm-serve-args.json,
sglang-server-args.json): an option the pinned runtime does not know is a bug in this module, so
`options()` raises `UnknownOption` (a programming error, never a user's) rather than write it.

Plain data, no torch: the graph derives the options at plan time (so a bad name fails the plan,
not a deployment), the package stage writes them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

TRTLLM_OPTIONS = "trtllm-llm-api-options.json"
VLLM_ARGS = "vllm-serve-args.json"
SGLANG_ARGS = "sglang-server-args.json"

# The files of serving/ (per parallelism entry when the recipe lists more than one).
LLM_API_OPTIONS_FILE = "llm_api_options.yaml"
VLLM_ARGS_FILE = "vllm_args.json"
SGLANG_ARGS_FILE = "sglang_args.json"
README_FILE = "README.md"
SERVING_DIR = "serving"

AUTO_KV = "auto"  # the KV-cache dtype when the format needs none said: the checkpoint's own choice


class NotServed(ValueError):
    """The runtime table says this runtime serves the format on no SM: it gets no options."""


def _table_options(runtime: str, s: "Serving") -> dict:
    from trtbuild.facts import serving

    if not serving.serves_somewhere(runtime, s.quant, s.kv_cache):
        raise NotServed(f"{runtime} serves {serving.format_label(s.quant, s.kv_cache)} on no SM (the runtime table)")
    return serving.options(runtime, s.quant, s.kv_cache)


def serving_runtimes(s: "Serving") -> list[str]:
    """The runtimes the table says serve the format on some SM (those that get options at plan time)."""
    from trtbuild.facts import serving

    return [r for r in serving.RUNTIMES if serving.serves_somewhere(r, s.quant, s.kv_cache)]


class UnknownOption(AssertionError):
    """trtbuild would write an option the pinned runtime does not accept: a bug here, not bad input."""


@lru_cache(maxsize=None)
def _table(name: str) -> dict:
    return json.loads(resources.files("trtbuild").joinpath("data", name).read_text())


def runtime_versions() -> dict[str, str]:
    """The versions whose argument lists the options are checked against (part of the package key)."""
    return {runtime: _table(told.arguments)["version"] for runtime, told in RUNTIME_OPTIONS.items()}


# ---- the checks ----------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _trtllm_fields() -> tuple[dict, dict]:
    table = _table(TRTLLM_OPTIONS)
    top = {f["name"]: f for f in table["llm_args_fields"] + table["torch_llm_args_fields_partial"]}
    kv = {f["name"]: f for f in table["kv_cache_config_fields"]}
    return top, kv


def _check_choice(where: str, entry: dict, value: Any) -> None:
    allowed = entry.get("choices") or entry.get("accepted_values") or []
    if allowed and value not in allowed:
        raise UnknownOption(f"{where}: {value!r} is not one of {allowed}")


def check_llm_api_options(options: dict) -> None:
    """Every key a field of TensorRT-LLM's LLM args (BaseLlmArgs has extra='forbid'), every value
    among the field's choices; kv_cache_config's keys fields of KvCacheConfig."""
    top, kv = _trtllm_fields()
    for name, value in options.items():
        if name not in top:
            raise UnknownOption(f"{TRTLLM_OPTIONS}: LLM args have no field {name!r}")
        if isinstance(value, dict):
            fields = kv if name == "kv_cache_config" else None
            if fields is None:
                raise UnknownOption(f"{TRTLLM_OPTIONS}: no nested table is known for {name!r}")
            for sub, sub_value in value.items():
                if sub not in fields:
                    raise UnknownOption(f"{TRTLLM_OPTIONS}: KvCacheConfig has no field {sub!r}")
                _check_choice(f"{TRTLLM_OPTIONS}: {name}.{sub}", fields[sub], sub_value)
        else:
            _check_choice(f"{TRTLLM_OPTIONS}: {name}", top[name], value)


@lru_cache(maxsize=None)
def _flags(name: str) -> dict[str, dict]:
    flags = {}
    for entry in _table(name)["flags"]:
        for spelling in [entry["flag"], *entry["aliases"]]:
            flags[spelling] = entry
    return flags


def check_argv(table: str, argv: Sequence[str]) -> None:
    """argv as `--flag value` pairs: each flag the runtime's parser defines, given once, its value
    among the flag's choices (or accepted values) and of its type."""
    flags, seen = _flags(table), set()
    if len(argv) % 2:
        raise UnknownOption(f"{table}: argv is not --flag value pairs: {list(argv)}")
    for flag, value in zip(argv[::2], argv[1::2]):
        entry = flags.get(flag)
        if entry is None:
            raise UnknownOption(f"{table}: the runtime's parser has no {flag}")
        if entry["dest"] in seen:
            raise UnknownOption(f"{table}: {flag} is given twice")
        seen.add(entry["dest"])
        if entry["nargs"] == 0:
            raise UnknownOption(f"{table}: {flag} takes no value")
        _check_choice(f"{table}: {flag}", entry, value)
        kind = entry["type"] or ""
        if kind == "int" or kind.startswith("human_readable_int"):
            if not value.isdigit():
                raise UnknownOption(f"{table}: {flag} takes an integer, not {value!r}")
        elif kind == "float":
            float(value)


# ---- the options ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Serving:
    """What the options are derived from: the package node's parameters for one parallelism entry."""

    quant: Optional[str]
    kv_cache: Optional[str]
    dtype: str
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    max_input_len: int
    memory_fraction: float
    tp: int = 1
    pp: int = 1


def llm_api_options(s: Serving) -> dict:
    """TensorRT-LLM's `extra_llm_api_options` (trtllm-serve --extra_llm_api_options, or LLM(**options))."""
    kv_dtype = _table_options("trtllm", s).get("kv_cache_dtype", AUTO_KV)
    options = {
        "dtype": s.dtype,
        "max_batch_size": s.max_batch_size,
        "max_num_tokens": s.max_num_tokens,
        "max_seq_len": s.max_seq_len,
        "max_input_len": s.max_input_len,
        "tensor_parallel_size": s.tp,
        "pipeline_parallel_size": s.pp,
        "kv_cache_config": {"dtype": kv_dtype,
                            "free_gpu_memory_fraction": s.memory_fraction},
    }
    check_llm_api_options(options)
    return options


def vllm_args(s: Serving) -> list[str]:
    """The arguments after `vllm serve DIR` (vllm_args.json stores them as an object: as_object)."""
    table, argv = _table_options("vllm", s), []
    if "quantization" in table:  # an unquantized checkpoint has no quantization_config for a method to read
        argv += ["--quantization", table["quantization"]]
    argv += ["--kv-cache-dtype", table.get("kv_cache_dtype", AUTO_KV),
             "--tensor-parallel-size", str(s.tp), "--pipeline-parallel-size", str(s.pp),
             "--max-model-len", str(s.max_seq_len), "--max-num-seqs", str(s.max_batch_size),
             "--max-num-batched-tokens", str(s.max_num_tokens),
             "--gpu-memory-utilization", str(s.memory_fraction), "--dtype", s.dtype]
    check_argv(VLLM_ARGS, argv)
    return argv


def sglang_args(s: Serving) -> list[str]:
    """The arguments after `python -m sglang.launch_server --model-path DIR` (stored as an object)."""
    table, argv = _table_options("sglang", s), []
    if "quantization" in table:
        argv += ["--quantization", table["quantization"]]
    argv += ["--kv-cache-dtype", table.get("kv_cache_dtype", AUTO_KV),
             "--tp-size", str(s.tp), "--pp-size", str(s.pp), "--context-length", str(s.max_seq_len),
             "--max-running-requests", str(s.max_batch_size),
             "--mem-fraction-static", str(s.memory_fraction), "--dtype", s.dtype]
    check_argv(SGLANG_ARGS, argv)
    return argv


def as_object(table: str, argv: Sequence[str]) -> dict[str, Any]:
    """argv as the JSON object the artifact stores: flag -> value, typed as the runtime's parser
    types it (an int, a float, else the string), so `LLM(**options)` can take it with `_` for `-`."""
    flags, options = _flags(table), {}
    for flag, value in zip(argv[::2], argv[1::2]):
        kind = flags[flag]["type"] or ""
        options[flag] = (int(value) if kind == "int" or kind.startswith("human_readable_int")
                         else float(value) if kind == "float" else value)
    return options


def parallel_dir(tp: int, pp: int) -> str:
    """The folder of one parallelism entry's options when the recipe lists several."""
    return f"tp{tp}" if pp == 1 else f"tp{tp}-pp{pp}"


def from_params(params: dict) -> list[tuple[str, Serving]]:
    """(folder under serving/, options inputs) per parallelism entry of the package node's params:
    serving/ itself when there is one entry, serving/tp2 (serving/tp2-pp2) each when several."""
    limits, splits = params["limits"], params["parallelism"]
    one = len(splits) == 1
    return [("" if one else parallel_dir(split["tp"], split["pp"]),
             Serving(params["quant"], params["kv_cache"], params["dtype"], limits["max_batch_size"],
                     limits["max_num_tokens"], limits["max_seq_len"], limits["max_input_len"],
                     params["memory_fraction"], split["tp"], split["pp"])) for split in splits]


def check_params(params: dict) -> None:
    """Derive every option of the package node (plan time) for each runtime the table says serves
    its format: raises UnknownOption on a bad one."""
    for _, s in from_params(params):
        for runtime in serving_runtimes(s):
            RUNTIME_OPTIONS[runtime].derive(s)


def _quote(argv: Sequence[str]) -> str:
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


def serve_command(runtime: str, s: Serving, folder: str = "DIR", options: str = SERVING_DIR) -> str:
    """The exact command of `runtime`, with the checkpoint at `folder` and the options at `options`
    (NotServed when the table says the runtime serves the format nowhere)."""
    if runtime == "trtllm":
        llm_api_options(s)
        return f"trtllm-serve {folder} --extra_llm_api_options {folder}/{options}/{LLM_API_OPTIONS_FILE}"
    if runtime == "vllm":
        return f"vllm serve {folder} {_quote(vllm_args(s))}"
    return f"python -m sglang.launch_server --model-path {folder} {_quote(sglang_args(s))}"


def _runtime_title(runtime: str) -> str:
    from trtbuild.facts import serving

    r = serving.RUNTIME_INFO[runtime]
    return f"{r.text} {r.default}"


def readme(entries: list[tuple[str, Serving]], refused: Optional[dict[str, str]] = None) -> str:
    """The README of serving/: the serve command of each runtime whose loader accepts the checkpoint,
    then each other runtime with the reason (`refused`: runtime -> reason)."""
    from trtbuild.facts import serving

    refused = refused or {}
    offered = [r for r in serving.RUNTIMES if r not in refused]
    lines = ["# Serving this checkpoint", "",
             "DIR is this folder. The options come from the recipe (limits, KV cache, parallelism, dtype,",
             "serving.memory_fraction); serving/check.json says which runtime's loader accepts the checkpoint",
             "on which GPU. Only runtimes whose loader accepts it get a command.", ""]
    for sub, s in entries:
        where = f"{SERVING_DIR}/{sub}" if sub else SERVING_DIR
        if sub:
            lines += [f"## tp={s.tp} pp={s.pp} ({where}/)", ""]
        for runtime in offered:
            lines += [f"{_runtime_title(runtime)}:", "", "```", serve_command(runtime, s, options=where), "```", ""]
    if refused:
        lines += ["## Not offered", ""]
        lines += [f"- {_runtime_title(runtime)}: {reason}" for runtime, reason in refused.items()]
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True)
class RuntimeOptions:
    """How one runtime of the runtime table is told its options: the pinned argument list they are
    checked against (trtbuild/data/), the file of serving/ that holds them, and their derivation."""

    arguments: str
    file: str
    derive: Callable[[Serving], Any]

    def text(self, s: Serving) -> str:
        """The file's content: YAML for an options object, the argument list as JSON otherwise."""
        told = self.derive(s)
        if isinstance(told, dict):
            return yaml.safe_dump(told, sort_keys=False)
        return json.dumps(as_object(self.arguments, told), indent=1) + "\n"


RUNTIME_OPTIONS: dict[str, RuntimeOptions] = {
    "trtllm": RuntimeOptions(TRTLLM_OPTIONS, LLM_API_OPTIONS_FILE, llm_api_options),
    "vllm": RuntimeOptions(VLLM_ARGS, VLLM_ARGS_FILE, vllm_args),
    "sglang": RuntimeOptions(SGLANG_ARGS, SGLANG_ARGS_FILE, sglang_args),
}


def write_serving(out: Path, params: dict, refused: Optional[dict[str, str]] = None) -> list[str]:
    """Write serving/ into `out`: the options per parallelism entry of each runtime not in `refused`
    (runtime -> why its loader rejects the checkpoint) and the README. Returns the paths written,
    relative to `out`."""
    from trtbuild.facts import serving

    refused = refused or {}
    entries = from_params(params)
    written = []
    for sub, s in entries:
        folder = out / SERVING_DIR / sub if sub else out / SERVING_DIR
        folder.mkdir(parents=True, exist_ok=True)
        for runtime in serving.RUNTIMES:
            if runtime not in refused:
                told = RUNTIME_OPTIONS[runtime]
                (folder / told.file).write_text(told.text(s))
                written.append((folder / told.file).relative_to(out).as_posix())
    (out / SERVING_DIR).mkdir(parents=True, exist_ok=True)
    (out / SERVING_DIR / README_FILE).write_text(readme(entries, refused))
    written.append(f"{SERVING_DIR}/{README_FILE}")
    return written
