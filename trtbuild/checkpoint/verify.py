"""Check a TensorRT-LLM checkpoint folder (config.json + rank{N}.safetensors) of a LLaMA-family
model against its Hugging Face config, before spending GPU time on trtllm-build. (The config.json
corrections are trtllm_config.fix_trtllm_config.)

Only headers are read (names, shapes, dtypes), never tensor data, and torch is not imported.

The tensors expected per quantization are the ones TensorRT-LLM 1.2's loading code accepts
(modeling_utils.preprocess_weights and the quantized layers; trtllm_load_rules.py cites file@commit),
which are the ones ModelOpt 0.47 exports except for W8A16 / W4A16: see docs/checkpoints.md. The
rules of that loading code that names, shapes and dtypes alone do not express (weight-only
substring matching, exclude_modules replacing the default exclusions) are in trtllm_load_rules.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trtbuild.checkpoint.hf_layout import HFLayout, check_parallel, hf_layout
from trtbuild.checkpoint.safetensors_files import ST_CODE, read_safetensors_header
from trtbuild.checkpoint.trtllm_load_rules import excluded, exclusion_problems, weight_only_problems
from trtbuild.checkpoint.trtllm_config import norm_rope_scaling, read_mapping
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.model.config import padded_vocab, read_json_object
from trtbuild.facts.quantformats import KV_CACHE_ALGOS, PER_GROUP_ALGOS, QUANT_ALGOS, TRTLLM_DEFAULT_GROUP_SIZE
from trtbuild.facts.trtllm import ENGINE_ARCHITECTURES

_AWQ = PER_GROUP_ALGOS
_RANK_FILE = re.compile(r"^rank(\d+)\.safetensors$")


class CheckpointInvalid(TrtbuildError):
    """A checkpoint that is not what TensorRT-LLM expects. Its message is one line: the first
    problem and how many more; `problems` holds them all (the checkpoint stage logs them)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        rest = len(self.problems) - 1
        more = f"; and {rest} more problem{'s' if rest > 1 else ''}" if rest else ""
        super().__init__(f"{self.problems[0]}{more}")


@dataclass(frozen=True)
class _Expect:
    shape: Optional[tuple[int, ...]]  # None: not checked
    dtype: Optional[str]  # safetensors code; None: not checked
    required: bool = True


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class _Expected:
    """The tensors TensorRT-LLM expects in one rank file."""

    def __init__(self, layout: HFLayout, config: dict, tp: int, pp: int) -> None:
        self.L, self.tp, self.pp = layout, tp, pp
        self.D = ST_CODE[config["dtype"]]
        quant = config.get("quantization") or {}
        self.algo = quant.get("quant_algo")
        self.kv_algo = quant.get("kv_cache_quant_algo")
        self.group = int(quant.get("group_size") or TRTLLM_DEFAULT_GROUP_SIZE)
        self.pre_quant_scale = bool(quant.get("pre_quant_scale", self.algo in _AWQ))
        self.exclude = quant.get("exclude_modules")  # None: TensorRT-LLM's defaults (trtllm_load_rules)
        self.vocab = int(config.get("vocab_size") or layout.vocab)
        self.parallel_embedding = bool(config.get("use_parallel_embedding", False))
        self.sharding_dim = int(config.get("embedding_sharding_dim", 0) or 0)
        self.shared_embedding = bool(config.get("share_embedding_table", False))

    def linear(self, out: dict, module: str, n_out: int, n_in: int, bias: bool) -> None:
        algo = None if excluded(module, self.exclude) else self.algo
        w, D = module + ".weight", self.D
        if bias:
            out[module + ".bias"] = _Expect((n_out,), D)
        if algo is None:
            out[w] = _Expect((n_out, n_in), D)
        elif algo == "FP8":
            out[w] = _Expect((n_out, n_in), "F8_E4M3")
            out[module + ".weights_scaling_factor"] = _Expect((1,), "F32")
            out[module + ".activation_scaling_factor"] = _Expect((1,), "F32")
        elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
            out[w] = _Expect((n_out, n_in), "F8_E4M3")
            out[module + ".per_channel_scale"] = _Expect((n_out,), "F32")
        elif algo == "W8A8_SQ_PER_CHANNEL":
            out[w] = _Expect((n_out, n_in), "I8")
            out[module + ".weights_scaling_factor"] = _Expect((n_out,), "F32")
            out[module + ".activation_scaling_factor"] = _Expect((1,), "F32")
            out[module + ".prequant_scaling_factor"] = _Expect((n_in,), D)
        elif algo in ("W8A16", "W4A16"):
            # TensorRT-LLM 1.2 quantizes these itself at load (preprocess_perlayer_weights ->
            # weight_only_quantize_dict, models/modeling_utils.py@b35ac1b): float weights in, its
            # own int8/int4 layout and per_channel_scale out. A pre-quantized tensor is not loadable.
            out[w] = _Expect((n_out, n_in), D)
        elif algo in _AWQ:
            out[w] = _Expect((n_out // 2, n_in), "I8")
            out[module + ".weights_scaling_factor"] = _Expect((n_out, n_in // self.group), "F32")
            if self.pre_quant_scale:
                out[module + ".prequant_scaling_factor"] = _Expect((n_in,), D)
            if algo == "W4A8_AWQ":
                out[module + ".weights_scaling_factor_2"] = _Expect((1,), "F32")
                out[module + ".activation_scaling_factor"] = _Expect((1,), "F32")
        elif algo == "NVFP4":
            out[w] = _Expect((n_out, n_in // 2), "U8")
            out[module + ".weights_scaling_factor"] = _Expect((n_out, n_in // 16), "F8_E4M3")
            out[module + ".weights_scaling_factor_2"] = _Expect((), "F32")
            out[module + ".activation_scaling_factor"] = _Expect((), "F32")

    def experts(self, out: dict, module: str, shape: tuple[int, int, int]) -> None:
        algo = None if excluded(module, self.exclude) else self.algo
        if algo is None or algo in ("W8A16", "W4A16"):  # weight-only: float, quantized at load (see linear)
            out[module + ".weight"] = _Expect(shape, self.D)
            return
        packed = algo in _AWQ or algo in ("W4A16", "NVFP4")
        dtype = "F8_E4M3" if algo.startswith("FP8") else "U8" if algo == "NVFP4" else "I8"
        out[module + ".weight"] = _Expect(None if packed else shape, dtype)
        for scale in ("weights_scaling_factor", "weights_scaling_factor_2", "activation_scaling_factor",
                      "prequant_scaling_factor", "per_channel_scale"):
            out[f"{module}.{scale}"] = _Expect(None, None, required=False)

    def rank(self, rank: int) -> dict[str, _Expect]:
        L, tp, D = self.L, self.tp, self.D
        p = rank // tp
        H, hd = L.hidden, L.head_dim
        out: dict[str, _Expect] = {}
        vocab_per = padded_vocab(self.vocab, tp) // tp
        if p == 0:
            if not self.parallel_embedding:
                shape = (self.vocab, H)
            elif self.sharding_dim == 0:
                shape = (vocab_per, H)
            else:
                shape = (self.vocab, H // tp)
            out["transformer.vocab_embedding.weight"] = _Expect(shape, D)
        per_stage = L.num_layers // self.pp
        kv_per = (L.kv_heads // tp if L.kv_heads >= tp else 1) * hd
        q_per = L.heads * hd // tp
        I_per = L.intermediate // tp
        for local in range(per_stage):
            d = f"transformer.layers.{local}."
            out[d + "input_layernorm.weight"] = _Expect((H,), D)
            out[d + "post_layernorm.weight"] = _Expect((H,), D)
            self.linear(out, d + "attention.qkv", q_per + 2 * kv_per, H, L.qkv_bias)
            self.linear(out, d + "attention.dense", H, q_per, False)
            if L.dense_bias:
                out[d + "attention.dense.bias"] = _Expect((H,), D)
            if self.kv_algo:
                scale = () if self.kv_algo == "NVFP4" else (1,)
                out[d + "attention.kv_cache_scaling_factor"] = _Expect(scale, "F32")
                out[d + "attention.k_cache_scaling_factor"] = _Expect(scale, "F32", required=False)
                out[d + "attention.v_cache_scaling_factor"] = _Expect(scale, "F32", required=False)
            if L.num_experts:
                E = L.num_experts
                out[d + "mlp.router.weight"] = _Expect((E, H), "F32")  # never quantized
                self.experts(out, d + "mlp.fc", (E, 2 * I_per, H))
                self.experts(out, d + "mlp.proj", (E, H, I_per))
            else:
                self.linear(out, d + "mlp.fc", I_per, H, L.mlp_bias)
                self.linear(out, d + "mlp.gate", I_per, H, L.mlp_bias)
                self.linear(out, d + "mlp.proj", H, I_per, False)
                if L.mlp_bias:
                    out[d + "mlp.proj.bias"] = _Expect((H,), D)
        if p == self.pp - 1:
            out["transformer.ln_f.weight"] = _Expect((H,), D)
            head: dict[str, _Expect] = {}
            self.linear(head, "lm_head", vocab_per, H, False)
            if self.shared_embedding and self.pp == 1:  # TRT-LLM then reuses the embedding table
                head = {k: _Expect(v.shape, v.dtype, required=False) for k, v in head.items()}
            out.update(head)
        return out


def _config_problems(cfg: dict, layout: HFLayout) -> list[str]:
    problems: list[str] = []

    def bad(msg: str) -> None:
        problems.append("config.json: " + msg)

    arch = cfg.get("architecture")
    if arch != layout.architecture:
        bad(f"architecture expected {layout.architecture!r} (the HF architectures[0]), found {arch!r}")
    elif arch not in ENGINE_ARCHITECTURES:
        bad(f"architecture {arch!r} is not in TensorRT-LLM's MODEL_MAP")
    if cfg.get("dtype") not in ST_CODE:
        bad(f"dtype expected one of float16, bfloat16, float32, found {cfg.get('dtype')!r}")

    for key, want in (("num_hidden_layers", layout.num_layers), ("num_attention_heads", layout.heads),
                      ("num_key_value_heads", layout.kv_heads), ("hidden_size", layout.hidden),
                      ("head_size", layout.head_dim), ("intermediate_size", layout.intermediate)):
        if key in cfg or key in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
            if cfg.get(key) != want:
                bad(f"{key} expected {want} (from the HF config), found {cfg.get(key)!r}")
    quant = cfg.get("quantization")
    algo = quant.get("quant_algo") if isinstance(quant, dict) else None
    vocab = cfg.get("vocab_size")
    allowed_vocab = {layout.vocab}
    if algo in _AWQ:  # ModelOpt pads the vocab to a multiple of 64 for AWQ
        allowed_vocab.add(-(-layout.vocab // 64) * 64)
    if vocab not in allowed_vocab:
        bad(f"vocab_size expected {' or '.join(str(v) for v in sorted(allowed_vocab))}, found {vocab!r}")
    if layout.num_experts:
        moe = cfg.get("moe") or {}
        if moe.get("num_experts") != layout.num_experts or moe.get("top_k") != layout.top_k:
            bad(f"moe expected num_experts {layout.num_experts}, top_k {layout.top_k}, found {cfg.get('moe')!r}")

    # RoPE: a missing rotary_base silently becomes TensorRT-LLM's default 10000.
    base = cfg.get("rotary_base")
    if base is None:
        if layout.rotary_base != 10000.0:
            bad(f"rotary_base missing; the HF config has rope_theta {layout.rotary_base} "
                f"(TensorRT-LLM would use 10000.0)")
    elif not isinstance(base, (int, float)) or float(base) != layout.rotary_base:
        bad(f"rotary_base expected {layout.rotary_base} (HF rope_theta), found {base!r}")
    want_scaling, found_scaling = norm_rope_scaling(layout.rotary_scaling), norm_rope_scaling(cfg.get("rotary_scaling"))
    if want_scaling != found_scaling:
        if found_scaling is None:
            bad(f"rotary_scaling missing; the HF config has rope_scaling {layout.rotary_scaling}")
        else:
            bad(f"rotary_scaling expected {layout.rotary_scaling} (HF rope_scaling), found {cfg.get('rotary_scaling')}")
    if layout.decoder == "qwen":
        if cfg.get("qwen_type") != layout.model_type:
            bad(f"qwen_type expected {layout.model_type!r}, found {cfg.get('qwen_type')!r} "
                f"(TensorRT-LLM defaults to 'qwen', the Qwen-1 layout)")
        if cfg.get("attn_bias") != layout.qkv_bias:
            bad(f"attn_bias expected {layout.qkv_bias}, found {cfg.get('attn_bias')!r}")

    if not isinstance(quant, dict) or "quant_algo" not in quant:
        bad(f"quantization expected an object with quant_algo and kv_cache_quant_algo, found {quant!r}")
    else:
        if quant.get("quant_algo") not in QUANT_ALGOS:
            bad(f"quantization.quant_algo {quant.get('quant_algo')!r} is not one of "
                f"{', '.join(str(a) for a in QUANT_ALGOS)}")
        if quant.get("kv_cache_quant_algo") not in KV_CACHE_ALGOS:
            bad(f"quantization.kv_cache_quant_algo {quant.get('kv_cache_quant_algo')!r} is not one of "
                f"{', '.join(str(a) for a in KV_CACHE_ALGOS)}")
        if quant.get("quant_algo") in _AWQ:
            group = quant.get("group_size", TRTLLM_DEFAULT_GROUP_SIZE)
            if not isinstance(group, int) or group <= 0:
                bad(f"quantization.group_size expected a positive integer, found {group!r}")
    return problems


def _ranks_desc(ranks) -> str:
    return ", ".join(f"rank{r}.safetensors" for r in sorted(ranks)) or "none"


def verify_trtllm_checkpoint(folder: Path, hf_config: dict) -> None:
    """Raise CheckpointInvalid (every problem found; one line) unless `folder` is a TensorRT-LLM
    checkpoint of the model `hf_config` describes, in the layout config.json claims."""
    folder = Path(folder)
    cfg = read_json_object(folder / "config.json")
    layout = hf_layout(hf_config, "HF config.json")
    problems = _config_problems(cfg, layout)
    tp, pp, world = read_mapping(cfg)
    try:
        check_parallel(layout, tp, pp, "HF config.json")
    except InvalidInput as exc:
        problems.append(f"config.json: mapping tp {tp} x pp {pp} does not fit the model: {exc}")
    present = {int(m.group(1)) for p in folder.iterdir() if (m := _RANK_FILE.match(p.name))}
    wanted = set(range(world))
    if present != wanted:
        problems.append(
            f"{folder}: config.json mapping (world_size {world} = tp {tp} x pp {pp}) needs "
            f"{_ranks_desc(wanted)}; missing: {_ranks_desc(wanted - present)}; "
            f"unexpected: {_ranks_desc(present - wanted)}")
    if problems:  # the rank files cannot be checked against a config that is wrong
        raise CheckpointInvalid(problems)

    quant = cfg["quantization"]
    # Held unquantized in every layout here: the embedding and MoE routers ("never quantized").
    float_modules = ["transformer.vocab_embedding"] + (
        [f"transformer.layers.{i}.mlp.router" for i in range(layout.num_layers // pp)] if layout.num_experts else [])
    problems += exclusion_problems(quant, float_modules)
    expected = _Expected(layout, cfg, tp, pp)
    for rank in range(world):
        path = folder / f"rank{rank}.safetensors"
        try:
            header = read_safetensors_header(path)
        except InvalidInput as exc:
            problems.append(str(exc))
            continue
        unloadable = weight_only_problems(path.name, header, quant)
        problems += list(unloadable.values())
        problems += _rank_problems(path, header, expected.rank(rank), skip=set(unloadable))
    if problems:
        raise CheckpointInvalid(problems)


def _rank_problems(path: Path, header: dict, want: dict[str, _Expect], skip: set = frozenset()) -> list[str]:
    """Names, shapes and dtypes against `want`; tensors in `skip` were reported already."""
    name = path.name
    problems = []
    for key in sorted(set(want) - skip):
        exp = want[key]
        if key not in header:
            if exp.required:
                what = " ".join(x for x in (exp.dtype, _fmt(exp.shape) if exp.shape else None) if x)
                problems.append(f"{name}: {key} missing (expected {what})")
            continue
        found_shape, found_dtype = tuple(header[key].get("shape", ())), header[key].get("dtype")
        if exp.shape is not None and found_shape != exp.shape:
            problems.append(f"{name}: {key} shape expected {_fmt(exp.shape)}, found {_fmt(found_shape)}")
        if exp.dtype is not None and found_dtype != exp.dtype:
            problems.append(f"{name}: {key} dtype expected {exp.dtype}, found {found_dtype}")
    for key in sorted(set(header) - set(want) - skip):
        problems.append(f"{name}: {key} unexpected ({header[key].get('dtype')} {_fmt(header[key].get('shape', ()))})")
    # A truncated file (an interrupted copy) has a valid header and too few data bytes.
    end = max((int(v["data_offsets"][1]) for v in header.values() if isinstance(v, dict) and "data_offsets" in v),
              default=0)
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    size = os.path.getsize(path)
    if size < 8 + header_len + end:
        problems.append(f"{name}: truncated (header needs {8 + header_len + end} bytes, file has {size})")
    return problems
