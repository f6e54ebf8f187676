"""TensorRT-LLM 1.2's own loading rules (trtbuild/checkpoint/trtllm_load_rules.py, file and commit
there) applied to the checkpoints trtbuild exports: the verifier refuses what that code refuses;
int8_wo engines come from a float W8A16 checkpoint that TensorRT-LLM quantizes at load, and
validation reads it back as TensorRT-LLM quantizes it (trtbuild/checkpoint/trtllm_loadtime.py)."""

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
from trtbuild.plan.expand import plan_recipe
from trtbuild.recipe.schema import load_recipe

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


def test_modelopts_w8a16_export_is_what_tensorrt_llm_refuses(int8_wo_export, tiny):
    """ModelOpt's W8A16 layout: int8 weights + 1-D weights_scaling_factor, exclude_modules [lm_head].
    trtbuild no longer writes it for engines (int8_wo engines come from a float checkpoint), and
    the verifier keeps refusing it."""
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
    """The test's own, independent reading of cutlass_preprocessors.cpp@b35ac1b symmetric_quantize
    for one [out, in] float weight (weight_only_quantize transposes to [in, out] and quantizes the
    last axis, i.e. per output channel): in float32, scale = max|w| * (1/128); q = round half away
    from zero of w / scale, clipped to [-128, 127]."""
    w = weight.to(torch.float32)
    scale = w.abs().amax(dim=1, keepdim=True) * np.float32(1 / 128)
    ratio = torch.where(scale != 0, w / torch.where(scale != 0, scale, 1), torch.zeros_like(w))
    rounded = torch.sign(ratio) * torch.floor(ratio.abs() + 0.5)
    return rounded.clamp(-128, 127).to(torch.int8)


def test_modelopts_int8_values_are_not_what_tensorrt_llm_computes(int8_wo_export):
    """Why int8_wo is validated by emulating TensorRT-LLM's load-time quantization, not through
    ModelOpt's fake quantization: TensorRT-LLM's scale is max/128 (the largest weight of a channel
    becomes 127 or -128), ModelOpt's max/127 (it becomes +-127); even ModelOpt's own dequantized
    weights come back as other int8 values."""
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
            assert bool((ints.max(dim=1).values < 127).any()), m  # channels whose extreme ModelOpt made -127
            assert not torch.equal(again, ints), m


# A small [out 4, in 4] bf16 weight and TensorRT-LLM's per-output-channel int8 round trip of it, worked
# out by hand (scale = max|row| / 128; q = w / scale rounded half away from zero, clipped to [-128, 127];
# back = q * scale). Every number is exact in bfloat16.
HAND_WEIGHT = [[1.0, -1.0, 0.5 / 128, 1.5 / 128],  # scale 1/128: ratios 128 -128 0.5 1.5 -> 127 -128 1 2
               [0.0, 0.0, 0.0, 0.0],  # max 0: scale 0, every value 0
               [-2.0, 1.0, 0.0, 2.0],  # scale 1/64: ratios -128 64 0 128 -> -128 64 0 127
               [-1 / 64, -3 / 64, 5 / 64, 4.0]]  # scale 1/32: ratios -0.5 -1.5 2.5 128 -> -1 -2 3 127 (not -0 -2 2)
HAND_INTS = [[127, -128, 1, 2], [0, 0, 0, 0], [-128, 64, 0, 127], [-1, -2, 3, 127]]
HAND_SCALES = [1 / 128, 0.0, 1 / 64, 1 / 32]
HAND_BACK = [[127 / 128, -1.0, 1 / 128, 2 / 128], [0.0, 0.0, 0.0, 0.0], [-2.0, 1.0, 0.0, 127 / 64],
             [-1 / 32, -2 / 32, 3 / 32, 127 / 32]]


def test_load_time_quantization_matches_a_hand_computed_int8_round_trip():
    from trtbuild.checkpoint.trtllm_loadtime import loadtime_weight, symmetric_quantize_last_axis

    weight = torch.tensor(HAND_WEIGHT, dtype=torch.bfloat16)
    # the op's view: [in, out], one scale per column, stored in the weight's dtype
    values, scales = symmetric_quantize_last_axis(weight.t().contiguous(), 8)
    assert values.t().tolist() == HAND_INTS and values.dtype == torch.int8
    assert scales.tolist() == HAND_SCALES and scales.dtype == torch.bfloat16
    back = loadtime_weight("transformer.layers.0.mlp.fc.weight", weight, "W8A16", None)
    assert back.dtype == torch.bfloat16 and back.tolist() == HAND_BACK
    # weight_only_quantize_dict's selection: names without a quantized part, excluded names, int8 tensors
    for name, exclude in (("lm_head.weight", None), ("transformer.vocab_embedding.weight", None),
                          ("transformer.layers.0.input_layernorm.weight", None),
                          ("transformer.layers.0.mlp.fc.weight", ["*mlp.fc.weight"])):
        assert loadtime_weight(name, weight, "W8A16", exclude) is weight, name
    assert loadtime_weight("transformer.layers.0.mlp.fc.weight", weight, None, None) is weight


def test_load_time_int4_and_batched_experts_follow_the_same_op():
    """quint4x2: scale max/8, clip [-8, 7]; a 3-D [E, out, in] stack is quantized matrix by matrix."""
    from trtbuild.checkpoint.trtllm_loadtime import loadtime_weight

    # max 4: scale 1/2; ratios 8 -3 1.5 -0.5 -> 7 (clipped) -3 2 -1; back 3.5 -1.5 1 -0.5
    row = torch.tensor([[4.0, -1.5, 0.75, -0.25]], dtype=torch.float32)
    assert loadtime_weight("x.qkv.weight", row, "W4A16", None).tolist() == [[3.5, -1.5, 1.0, -0.5]]
    experts = torch.stack([torch.tensor(HAND_WEIGHT), 2 * torch.tensor(HAND_WEIGHT)]).to(torch.bfloat16)
    back = loadtime_weight("transformer.layers.0.mlp.fc.weight", experts, "W8A16", None)
    assert back[0].tolist() == HAND_BACK and back[1].tolist() == [[2 * v for v in r] for r in HAND_BACK]


def converted_int8_wo(tiny: Path, out: Path, tp: int) -> Path:
    from trtbuild.checkpoint.trtllm_convert import convert_hf_to_trtllm

    convert_hf_to_trtllm(tiny, out, tp, 1, "bfloat16", quant="int8_wo")
    return out


def test_int8_wo_checkpoint_passes_tensorrt_llms_loading_rules(tiny, tmp_path):
    """What trtbuild writes for int8_wo engines: the source's float weights, `quant_algo: W8A16`, no
    exclude_modules (TensorRT-LLM's defaults keep lm_head and the embedding float); every tensor the
    weight-only preprocessing picks is a 2-D float weight."""
    from trtbuild.checkpoint.trtllm_load_rules import weight_only_problems
    from trtbuild.checkpoint.safetensors_files import read_safetensors_header

    out = converted_int8_wo(tiny, tmp_path / "w8", 1)
    config = hf_config(out)
    assert config["quantization"] == {"quant_algo": "W8A16", "kv_cache_quant_algo": None,
                                      "has_zero_point": False, "pre_quant_scale": False}
    verify_trtllm_checkpoint(out, hf_config(tiny))
    header = read_safetensors_header(out / "rank0.safetensors")
    assert weight_only_problems("rank0.safetensors", header, config["quantization"]) == {}
    source = load_file(tiny / "model.safetensors")
    tensors = load_file(out / "rank0.safetensors")
    assert torch.equal(tensors["transformer.layers.1.mlp.proj.weight"], source["model.layers.1.mlp.down_proj.weight"])
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}


def test_int8_wo_checkpoint_reads_back_as_the_engine_holds_it(tiny, tmp_path):
    """Validation reads the float checkpoint back with each rank's weight-only linears quantized as
    TensorRT-LLM quantizes them: per rank, so a row-parallel layer's channels take their maximum over
    that rank's half of the inputs (tp 2); everything else comes back unchanged."""
    from trtbuild.checkpoint.trtllm_inverse import trtllm_to_hf_state

    source = load_file(tiny / "model.safetensors")
    for tp in (1, 2):
        state = trtllm_to_hf_state(converted_int8_wo(tiny, tmp_path / f"w8-tp{tp}", tp), hf_config(tiny))
        for hf_name in ("model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight"):
            w = source[hf_name]
            halves = w.chunk(tp, dim=1)  # row-parallel: each rank holds a slice of the inputs
            expected = torch.cat([trtllm_int8_weight_only(h).to(torch.float32) * (
                h.to(torch.float32).abs().amax(dim=1, keepdim=True) * np.float32(1 / 128)) for h in halves], dim=1)
            assert torch.equal(state[hf_name], expected.to(torch.bfloat16)), (tp, hf_name)
        w = source["model.layers.0.mlp.gate_proj.weight"]  # column-parallel: whole rows, as at tp 1
        expected = trtllm_int8_weight_only(w).to(torch.float32) * (
            w.to(torch.float32).abs().amax(dim=1, keepdim=True) * np.float32(1 / 128))
        assert torch.equal(state["model.layers.0.mlp.gate_proj.weight"], expected.to(torch.bfloat16)), tp
        for kept in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                     "model.layers.0.input_layernorm.weight"):
            assert torch.equal(state[kept], source[kept]), (tp, kept)
        assert not torch.equal(state["model.layers.0.mlp.gate_proj.weight"], w)


def test_int8_wo_engines_are_planned_for_ampere_and_hopper(ws):
    """A user who asks for int8_wo engines for A100 (sm80), A10G (sm86) and H100 (sm90) gets them."""
    body = minimal("variants: {w8: {quant: int8_wo}}", "[sm80, A10G, sm90]")
    plan = plan_recipe(load_recipe(ws.recipe(body)))
    assert {t.name: (t.status, t.reason) for t in plan.targets} == {
        "w8-tp1": ("ok", None), "w8-tp1-sm80": ("ok", None), "w8-tp1-sm86": ("ok", None),
        "w8-tp1-sm90": ("ok", None)}


def test_exclude_modules_must_keep_the_defaults_the_checkpoint_relies_on():
    from trtbuild.checkpoint.trtllm_load_rules import exclusion_problems, excluded

    modules = ["transformer.vocab_embedding", "transformer.layers.0.mlp.router"]
    assert exclusion_problems({"quant_algo": "FP8", "exclude_modules": ["lm_head"]}, modules) == [
        "config.json: quantization.exclude_modules ['lm_head'] replaces TensorRT-LLM 1.2's default exclusions and "
        "does not cover transformer.layers.0.mlp.router: TensorRT-LLM would build it as a FP8 linear"]
    assert exclusion_problems({"quant_algo": "FP8", "exclude_modules": ["lm_head", "*router"]}, modules) == []
    assert exclusion_problems({"quant_algo": "W8A16", "exclude_modules": None}, modules) == []  # the defaults
    assert exclusion_problems({"quant_algo": None, "exclude_modules": []}, modules) == []
    # quantize_layers: `exclude_modules or [defaults]`: an empty list keeps the defaults too
    assert exclusion_problems({"quant_algo": "W8A16", "exclude_modules": []}, modules) == []
    assert excluded("transformer.vocab_embedding", [])
    # 1.2 matches the module's full name only: no ancestor walk, no regular expressions
    assert excluded("transformer.layers.0.mlp.router", ["*router"])
    assert not excluded("transformer.layers.0.mlp.router", ["transformer.layers.0.mlp"])
    assert not excluded("lm_head", ["re:lm_.*"])
    assert excluded("lm_head", None) and not excluded("transformer.layers.0.mlp.fc", None)
