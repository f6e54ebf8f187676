"""TensorRT-LLM 1.2's own loading rules (reference/trtllm.md section 11) applied to the checkpoints
trtbuild exports: the verifier refuses what that code refuses, and a format with no loadable layout
is refused at plan time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import minimal
from tinymodels import make_model, make_tokenizer
from trtbuild.checkpoint.verify import CheckpointInvalid, verify_trtllm_checkpoint
from trtbuild.plan import plan_recipe
from trtbuild.recipe import load_recipe

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

LINEARS = ("attention.dense", "attention.qkv", "mlp.fc", "mlp.gate", "mlp.proj")  # sorted, as verify reports
# Output features of the tiny model's linears: hidden 64, 4 heads + 2 KV heads of 16, intermediate 128.
N_OUT = {"attention.dense": 64, "attention.qkv": 128, "mlp.fc": 128, "mlp.gate": 128, "mlp.proj": 64}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return make_model(root / "model", "llama", make_tokenizer(root / "tokenizer"))


@pytest.fixture(scope="module")
def int8_wo_model(tiny):
    """The tiny LLaMA quantized int8_wo by ModelOpt (max calibration: fast on a CPU)."""
    from trtbuild.checkpoint import calibration as cal
    from trtbuild.checkpoint import quantize as q

    ids, _ = cal.make_windows(tiny, cal.read_text("builtin", Path(".")), 2, 32, seed=0)
    model = q.load_model(tiny, "bfloat16", "cpu")
    q.calibrate_and_quantize(model, "int8_wo", None, 128, ids, "cpu")
    return model


@pytest.fixture(scope="module")
def int8_wo_export(int8_wo_model, tmp_path_factory) -> Path:
    from trtbuild.checkpoint import quantize as q

    out = tmp_path_factory.mktemp("int8wo") / "ckpt"
    q.export_trtllm(int8_wo_model, out, 1, 1, "bfloat16")
    return out


def hf_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def test_todays_int8_wo_export_is_what_tensorrt_llm_refuses(int8_wo_export, tiny):
    """ModelOpt's W8A16 layout: int8 weights + 1-D weights_scaling_factor, exclude_modules [lm_head]."""
    config = hf_config(int8_wo_export)
    assert config["quantization"] == {"quant_algo": "W8A16", "kv_cache_quant_algo": None,
                                      "exclude_modules": ["lm_head"]}
    with pytest.raises(CheckpointInvalid) as caught:
        verify_trtllm_checkpoint(int8_wo_export, hf_config(tiny))
    embedding = ("config.json: quantization.exclude_modules ['lm_head'] replaces TensorRT-LLM 1.2's default "
                 "exclusions and does not cover transformer.vocab_embedding: TensorRT-LLM would build it as a "
                 "WeightOnlyQuantEmbedding (int8 weight and per_token_scale)")
    per_tensor = []
    for layer in (0, 1):
        for linear in LINEARS:
            m = f"transformer.layers.{layer}.{linear}"
            part = linear.split(".")[-1] + ".weight"
            n_out = N_OUT[linear]
            per_tensor.append(
                f"rank0.safetensors: {m}.weight is int8: TensorRT-LLM 1.2 quantizes W8A16 weights itself at load, "
                f"from float weights, into its per-GPU layout; an int8 tensor is passed through unprocessed and "
                f"gets no per_channel_scale")
            per_tensor.append(
                f"rank0.safetensors: {m}.weights_scaling_factor (F32 [{n_out}]) contains {part!r}, so TensorRT-LLM "
                f"1.2's weight-only preprocessing quantizes it, and its quantize op raises "
                f"'Invalid dim. The dim of weight should be 2 or 3'")
    assert caught.value.problems == [embedding] + per_tensor
    assert str(caught.value) == f"{embedding}; and {len(per_tensor)} more problems"


def trtllm_int8_weight_only(weight: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM 1.2's W8A16 load-time quantization of one [out, in] float weight, as
    cutlass_preprocessors.cpp@b35ac1b symmetric_quantize describes it (weight_only_quantize
    transposes to [in, out] and quantizes the last axis, i.e. per output channel): in float32,
    scale = max|w| * (1/128); q = round half away from zero of w / scale, clipped to [-128, 127]."""
    w = weight.to(torch.float32)
    scale = w.abs().amax(dim=1, keepdim=True) * np.float32(1 / 128)
    ratio = torch.where(scale != 0, w / torch.where(scale != 0, scale, 1), torch.zeros_like(w))
    rounded = torch.sign(ratio) * torch.floor(ratio.abs() + 0.5)
    return rounded.clamp(-128, 127).to(torch.int8)


def test_no_float_layout_gives_back_modelopts_int8_values(int8_wo_export):
    """Why int8_wo has no TensorRT-LLM 1.2 layout. Whatever float weights a checkpoint holds, the
    element of largest magnitude in a channel divides to exactly +-128 and clips to 127 or -128, so
    only channels whose ModelOpt ints contain +127 could come back unchanged; ModelOpt's
    (scale max/127) have -127 as their only extreme in others. Its dequantized weights, the nearest
    candidate layout, come back different."""
    tensors = load_file(int8_wo_export / "rank0.safetensors")
    for layer in (0, 1):
        for linear in LINEARS:
            m = f"transformer.layers.{layer}.{linear}"
            ints, scale = tensors[m + ".weight"], tensors[m + ".weights_scaling_factor"]
            dequantized = ints.to(torch.float32) * scale[:, None]
            again = trtllm_int8_weight_only(dequantized)
            extreme = dequantized.abs().argmax(dim=1)
            rows = torch.arange(ints.shape[0])
            assert set(again[rows, extreme].tolist()) <= {127, -128}, m
            no_plus_127 = (ints.max(dim=1).values < 127)
            assert bool(no_plus_127.any()), m  # channels no float layout can reproduce
            assert not torch.equal(again, ints), m


def test_the_rule_emulation_matches_the_source_on_edge_cases():
    """Round half away from zero (C++ round), the 1/128 scale, the asymmetric clip, a zero row."""
    w = torch.tensor([[1.0, -1.0, 0.5 / 128, 1.5 / 128], [0.0, 0.0, 0.0, 0.0], [-2.0, 1.0, 0.0, 2.0]])
    assert trtllm_int8_weight_only(w).tolist() == [[127, -128, 1, 2], [0, 0, 0, 0], [-128, 64, 0, 127]]


def test_int8_wo_is_refused_for_engines_at_plan_time(ws):
    body = minimal("variants: {w8: {quant: int8_wo}}\nbackends: [engine, hf-checkpoint]", "[sm90]")
    plan = plan_recipe(load_recipe(ws.recipe(body)))
    reason = ("INT8 weight-only has no TensorRT-LLM 1.2 checkpoint layout: TensorRT-LLM quantizes W8A16 weights "
              "itself at load, from float weights (per channel, scale max/128, clipped to [-128, 127]), and no float "
              "weights give back ModelOpt's int8 values (scale max/127) in a channel whose largest weight is "
              "negative; and no serving runtime claims its Hugging Face checkpoint (trtbuild/serving.py): use int4_wo "
              "or fp8")
    ckpt = plan.target("w8-tp1")
    assert (ckpt.status, ckpt.reason) == ("impossible", reason)
    engine = plan.target("w8-tp1-sm90")
    assert (engine.status, engine.reason) == ("impossible", f"needs checkpoint w8-tp1, which is impossible: {reason}")
    hf = plan.target("w8-hf")  # reference/serving.md: no runtime claims W8A16 (trtllm's loader reads it, unmatrixed)
    assert (hf.status, hf.reason.split(": trtllm>=1.3: ")[0]) == ("impossible", "no runtime serves INT8 weight-only on sm90")


def test_weight_only_checkpoint_in_tensorrt_llms_layout_passes(int8_wo_export, tiny, tmp_path):
    """What TensorRT-LLM 1.2 loads for W8A16: float weights, default exclusions (or a list that keeps
    them); the tensors its preprocessing quantizes are all 2-D floats."""
    folder = tmp_path / "w8a16"
    folder.mkdir()
    tensors = load_file(int8_wo_export / "rank0.safetensors")
    floats = {}
    for name, t in tensors.items():
        if name.endswith(".weights_scaling_factor"):
            continue
        if t.dtype == torch.int8:
            scale = tensors[name.replace(".weight", ".weights_scaling_factor")]
            t = (t.to(torch.float32) * scale[:, None]).to(torch.bfloat16)
        floats[name] = t
    save_file(floats, str(folder / "rank0.safetensors"))
    config = hf_config(int8_wo_export)
    config["quantization"] = {"quant_algo": "W8A16", "kv_cache_quant_algo": None, "exclude_modules": None}
    (folder / "config.json").write_text(json.dumps(config))
    verify_trtllm_checkpoint(folder, hf_config(tiny))
    config["quantization"]["exclude_modules"] = ["*lm_head", "*vocab_embedding"]
    (folder / "config.json").write_text(json.dumps(config))
    verify_trtllm_checkpoint(folder, hf_config(tiny))


def test_exclude_modules_must_keep_the_defaults_the_checkpoint_relies_on():
    from trtbuild.checkpoint.trtllm_load_rules import exclusion_problems, excluded

    modules = ["transformer.vocab_embedding", "transformer.layers.0.mlp.router"]
    assert exclusion_problems({"quant_algo": "FP8", "exclude_modules": ["lm_head"]}, modules) == [
        "config.json: quantization.exclude_modules ['lm_head'] replaces TensorRT-LLM 1.2's default exclusions and "
        "does not cover transformer.layers.0.mlp.router: TensorRT-LLM would build it as a FP8 linear"]
    assert exclusion_problems({"quant_algo": "FP8", "exclude_modules": ["lm_head", "*router"]}, modules) == []
    assert exclusion_problems({"quant_algo": "W8A16", "exclude_modules": None}, modules) == []  # the defaults
    assert exclusion_problems({"quant_algo": None, "exclude_modules": []}, modules) == []
    # 1.2 matches the module's full name only: no ancestor walk, no regular expressions
    assert excluded("transformer.layers.0.mlp.router", ["*router"])
    assert not excluded("transformer.layers.0.mlp.router", ["transformer.layers.0.mlp"])
    assert not excluded("lm_head", ["re:lm_.*"])
    assert excluded("lm_head", None) and not excluded("transformer.layers.0.mlp.fc", None)
