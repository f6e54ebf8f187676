"""The `trtllm-build` command line of an engine node, in one place: the engine stage runs it, and
`trtbuild explain` prints it.

The argv holds relative paths only: the stage runs it with the current folder set to a work folder
that holds `checkpoint/` (and `timing-in.cache` when a timing cache is stored), and a container
mounts that folder and runs the same argv. So the command, like the key, names no host path.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from trtbuild.facts import trtllm

CHECKPOINT_DIR = "checkpoint"
OUTPUT_DIR = "engine"
TIMING_CACHE_IN = "timing-in.cache"
TIMING_CACHE_OUT = "timing.cache"
EXECUTABLE = "trtllm-build"

# The engine node's limit params, in the order the command passes them.
LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")


def flag_args(name: str, value: Any) -> list[str]:
    """One flag as argv words, by its kind in the flag table: a switch is present or absent."""
    kind = trtllm.flag_table()[name].kind
    if kind == "bool":
        return [f"--{name}"] if value else []
    if kind == "list":
        return [f"--{name}", *map(str, value)]
    return [f"--{name}", str(value)]


def build_argv(params: dict, workers: int, timing_cache_in: bool) -> list[str]:
    """`params`: the engine node's param values (limits and `flags`). `timing_cache_in`: whether a
    stored timing cache is placed at TIMING_CACHE_IN (trtllm-build also ignores a missing one, but
    the command should not name a file that is not there)."""
    argv = [EXECUTABLE, "--checkpoint_dir", CHECKPOINT_DIR, "--output_dir", OUTPUT_DIR]
    for name in LIMITS:
        argv += [f"--{name}", str(params[name])]
    for name, value in sorted(params.get("flags", {}).items()):
        argv += flag_args(name, value)
    argv += ["--workers", str(workers)]
    if timing_cache_in:
        argv += ["--input_timing_cache", TIMING_CACHE_IN]
    argv += ["--output_timing_cache", TIMING_CACHE_OUT]
    return argv


def shell_line(argv: list[str]) -> str:
    return shlex.join(argv)


# Flags that change which tactics TensorRT times: the precision of each layer (plugin dtypes, FP8
# paths) and the fusions that change the layers themselves. Limits change the optimization
# profiles, not the tactics of a layer shape, and TensorRT keys each timing by layer signature, so
# one cache can serve several limit sets; everything else (logits gathering, debug output) adds or
# removes outputs only. A wrong grouping would cost build time, never correctness: TensorRT
# re-times what the cache lacks.
TACTIC_FLAGS = frozenset({
    "gemm_plugin", "gpt_attention_plugin", "bert_attention_plugin", "moe_plugin", "mamba_conv1d_plugin",
    "nccl_plugin", "gemm_swiglu_plugin", "low_latency_gemm_plugin", "low_latency_gemm_swiglu_plugin",
    "fp8_rowwise_gemm_plugin", "gemm_allreduce_plugin", "lora_plugin", "dora_plugin",
    "context_fmha", "bert_context_fmha_fp32_acc", "use_paged_context_fmha", "use_fp8_context_fmha",
    "remove_input_padding", "use_fused_mlp", "norm_quant_fusion", "reduce_fusion", "user_buffer",
    "fuse_fp4_quant", "paged_state", "pp_reduce_scatter", "multiple_profiles", "kv_cache_type",
    "tokens_per_block", "weight_sparsity", "strip_plan", "fast_build", "logits_dtype", "weight_streaming",
})


def tactic_options(params: dict) -> dict:
    """The engine's options that change TensorRT's tactic choices (for the timing cache's key)."""
    return {name: value for name, value in sorted(params.get("flags", {}).items()) if name in TACTIC_FLAGS}


def workers_for(world_size: int, local_gpus: int) -> int:
    """trtllm-build builds ranks in parallel on up to min(GPUs, workers) GPUs (reference/trtllm.md
    section 1): one worker per local GPU, no more than there are ranks, at least one."""
    return max(1, min(local_gpus, world_size))


class FlagTableError(ValueError):
    """argparse's complaint about an argv, raised instead of exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise FlagTableError(message)


def flag_parser() -> argparse.ArgumentParser:
    """An argparse parser built from the pinned flag table (types, choices, switches, aliases)."""
    parser = _Parser(prog=EXECUTABLE, add_help=False, allow_abbrev=False)
    for flag in {f.name: f for f in trtllm.flag_table().values()}.values():
        names = [f"--{flag.name}", *(f"--{a}" for a in flag.aliases)]
        if flag.kind == "bool":
            parser.add_argument(*names, action="store_true")
        elif flag.kind == "int":
            parser.add_argument(*names, type=int)
        elif flag.kind == "list":
            parser.add_argument(*names, nargs="+", choices=flag.choices or None)
        else:
            parser.add_argument(*names, choices=flag.choices or None)
    return parser


def parse_with_flag_table(argv: list[str]) -> argparse.Namespace:
    """Parse a trtllm-build argv (with or without the program name) as the pinned parser would;
    FlagTableError for an unknown flag, a bad choice or a bad type."""
    words = argv[1:] if argv and argv[0] == EXECUTABLE else argv
    return flag_parser().parse_args(words)
