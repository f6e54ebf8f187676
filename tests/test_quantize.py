"""Calibration text/windows and ModelOpt quantization + export on tiny random Llama, Qwen2 and
Mistral models (bf16, 2 layers, hidden 64) with a small real BPE tokenizer trained on
`pydoc_data.topics`. ModelOpt is imported once (module-scoped fixtures) and each quantized model
is built once and shared by the tests that need it."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import torch  # the README's test install brings torch, transformers and modelopt: missing, the tests fail
from safetensors import safe_open

from trtbuild.checkpoint import calibration as cal  # noqa: E402
from trtbuild.checkpoint import quantize as q  # noqa: E402
from trtbuild.checkpoint.modelopt_config import modelopt_modules  # noqa: E402
from trtbuild.checkpoint.quantstate import quantizer_tensors  # noqa: E402
from trtbuild.errors import InvalidInput  # noqa: E402
from trtbuild.facts.quantformats import FORMATS, KV_FORMATS  # noqa: E402
from tinymodels import make_model, make_tokenizer, pydoc_text  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

ARCHS = ("llama", "qwen2", "mistral")
CPU_FORMATS = ("fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo")
GROUP = 32
SAMPLES, SEQ_LEN = 8, 32
# What ModelOpt 0.47 writes in hf_quant_config.json (same names as the TRT-LLM config).
HF_QUANT_ALGO = {"fp8": "FP8", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int4_awq": "W4A16_AWQ",
                 "w4a8_awq": "W4A8_AWQ", "int8_wo": "W8A16", "int4_wo": "W4A16_AWQ"}
# Quantized Linear layers of the tiny models: q, k, v, o, gate, up, down per layer, 2 layers.
QUANTIZED_LINEARS = 14


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A 512-token byte-level BPE trained on pydoc_data.topics, saved as a fast HF tokenizer."""
    folder = make_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    assert len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]) <= 512
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_dir) -> dict[str, Path]:
    return {arch: make_model(tmp_path_factory.mktemp(arch) / "model", arch, tokenizer_dir) for arch in ARCHS}


@pytest.fixture(scope="module")
def windows(models) -> np.ndarray:
    ids, meta = cal.make_windows(models["llama"], cal.read_text("builtin", Path(".")), SAMPLES, SEQ_LEN, seed=0)
    assert ids.shape == (SAMPLES, SEQ_LEN) and ids.dtype == np.int32 and not meta["overlapping"]
    return ids


@pytest.fixture(scope="module")
def modelopt():
    """Import ModelOpt once for the whole module."""
    return modelopt_modules()


@pytest.fixture(scope="module")
def quantized(models, windows, modelopt):
    """get(arch, quant, kv) -> (model, report, logits right after quantization), built once."""
    cache: dict = {}
    test_ids = torch.from_numpy(windows[:2].astype(np.int64))

    def get(arch: str, quant, kv):
        key = (arch, quant, kv)
        if key not in cache:
            model = q.load_model(models[arch], "bfloat16", "cpu")
            report = q.calibrate_and_quantize(model, quant, kv, GROUP, windows, "cpu")
            with torch.no_grad():
                logits = model(test_ids).logits
            cache[key] = (model, report, logits)
        return cache[key]

    get.test_ids = test_ids
    return get


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _tensor_dtypes(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}


# ------------------------------------------------------------------------------------------------
# Calibration text and windows


def test_read_text_builtin_file_and_folder(tmp_path):
    builtin = cal.read_text("builtin", tmp_path)
    assert builtin == pydoc_text() and len(builtin) > 100_000
    (tmp_path / "one.txt").write_text("alpha")
    assert cal.read_text("one.txt", tmp_path) == "alpha"
    assert cal.read_text(str(tmp_path / "one.txt"), Path("/nonexistent")) == "alpha"
    folder = tmp_path / "corpus"
    (folder / "b" / "deep").mkdir(parents=True)
    (folder / "b" / "deep" / "z.rst").write_text("third")
    (folder / "a.md").write_text("first")
    (folder / "b" / "c.txt").write_text("second")
    (folder / "ignored.json").write_text("{}")
    (folder / "ignored.py").write_text("x = 1")
    assert cal.read_text("corpus", tmp_path) == "first\n\nsecond\n\nthird"


def test_read_text_errors(tmp_path):
    with pytest.raises(InvalidInput, match=r"calibration.text: missing: no such file or folder"):
        cal.read_text("missing", tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "data.bin").write_bytes(b"\0")
    with pytest.raises(InvalidInput, match=r"calibration.text: empty: .*holds no text files"):
        cal.read_text("empty", tmp_path)


def test_text_digest_depends_on_content_only(tmp_path):
    for folder, names in (("x", ("1.txt", "2.txt")), ("y", ("a.md", "b.rst"))):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / names[0]).write_text("The quick brown fox")
        (tmp_path / folder / names[1]).write_text("jumps over the lazy dog.")
    assert cal.text_digest("x", tmp_path) == cal.text_digest("y", tmp_path)
    (tmp_path / "y" / "b.rst").write_text("jumps over the lazy cog.")
    assert cal.text_digest("x", tmp_path) != cal.text_digest("y", tmp_path)
    assert cal.text_digest("builtin", tmp_path) == cal.text_digest("builtin", tmp_path / "elsewhere")


def test_windows_deterministic_and_seeded(models, tmp_path):
    text = pydoc_text()
    a, meta_a = cal.make_windows(models["llama"], text, 6, 48, seed=7)
    b, meta_b = cal.make_windows(models["qwen2"], text, 6, 48, seed=7)  # same tokenizer files
    c, _ = cal.make_windows(models["llama"], text, 6, 48, seed=8)
    assert np.array_equal(a, b) and meta_a == meta_b
    assert not np.array_equal(a, c)
    assert a.shape == (6, 48) and a.dtype == np.int32
    assert meta_a["tokens"] > 100_000 and meta_a["overlapping"] is False
    starts = meta_a["starts"]
    assert all(s2 >= s1 + 48 for s1, s2 in zip(starts, starts[1:]))  # disjoint
    # The windows are the tokenizer's ids of the text, in order.
    ids = cal.tokenize(models["llama"], text)
    assert np.array_equal(a[2], ids[starts[2]:starts[2] + 48])

    cal.save_windows(tmp_path / "w", a, meta_a)
    assert np.array_equal(cal.load_windows(tmp_path / "w"), a)
    assert json.loads((tmp_path / "w" / "windows.json").read_text())["seed"] == 7


def test_windows_short_text_overlap_and_too_short(models):
    text = "def f(x):\n    return x + 1\n" * 20
    n = len(cal.tokenize(models["llama"], text))
    ids, meta = cal.make_windows(models["llama"], text, 8, n // 2, seed=0)
    assert meta["overlapping"] is True and meta["tokens"] == n and ids.shape == (8, n // 2)
    with pytest.raises(InvalidInput, match=rf"has {n} tokens.*fewer than seq_len {n + 1}"):
        cal.make_windows(models["llama"], text, 1, n + 1, seed=0)


def test_choose_starts_exact_fit():
    starts, overlapping = cal.choose_starts(100, 4, 25, seed=3)
    assert starts == [0, 25, 50, 75] and not overlapping


# ------------------------------------------------------------------------------------------------
# Configs


def test_quant_config_copies_and_group_size(modelopt):
    mtq, _ = modelopt
    snapshot = {name: copy.deepcopy(getattr(mtq, name)) for name in
                ("INT4_AWQ_CFG", "W4A8_AWQ_BETA_CFG", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "FP8_DEFAULT_CFG",
                 "FP8_KV_CFG")}
    for quant in ("int4_awq", "w4a8_awq", "int4_wo"):
        cfg = q.quant_config(quant, "fp8", 64)
        weight = next(e for e in cfg["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer")
        first = weight["cfg"][0] if isinstance(weight["cfg"], list) else weight["cfg"]
        assert first["block_sizes"][-1] == 64
        assert cfg["quant_cfg"][-1]["quantizer_name"] == "*[kv]_bmm_quantizer"
        cfg["quant_cfg"].clear()  # a copy: mutating it must not touch ModelOpt
    assert q.quant_config("int4_awq", None, None)["quant_cfg"][1]["cfg"]["block_sizes"][-1] == 128
    assert {name: getattr(mtq, name) for name in snapshot} == snapshot
    int8_kv = q.quant_config("fp8", "int8", None)["quant_cfg"][-1]
    assert int8_kv == {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}
    kv_only = q.quant_config(None, "fp8", None)
    assert kv_only["quant_cfg"][0] == {"quantizer_name": "*", "enable": False} and len(kv_only["quant_cfg"]) == 2
    assert q.quant_config("int4_wo", None, GROUP)["algorithm"] == "max"
    assert not any(e.get("quantizer_name") == "*input_quantizer" and e.get("enable", True)
                   for e in q.quant_config("int4_wo", None, GROUP)["quant_cfg"])
    with pytest.raises(InvalidInput, match="quantization 'int3'"):
        q.quant_config("int3", None, None)
    with pytest.raises(InvalidInput, match="nothing to quantize"):
        q.quant_config(None, None, None)


def _dynamic_blocks(cfg: dict) -> bool:
    for entry in cfg["quant_cfg"]:
        parts = entry.get("cfg") or []
        for part in parts if isinstance(parts, list) else [parts]:
            if (part.get("block_sizes") or {}).get("type") == "dynamic":
                return True
    return False


def test_needs_cuda(models, windows, modelopt):
    reason = q.needs_cuda("nvfp4", None)
    assert reason and "CUDA" in reason and "dynamic block" in reason
    assert "kv_cache nvfp4" in q.needs_cuda("fp8", "nvfp4")
    for quant in CPU_FORMATS:
        assert q.needs_cuda(quant, "fp8") is None and q.needs_cuda(quant, None) is None
        assert not _dynamic_blocks(q.quant_config(quant, "fp8", GROUP))
    assert q.needs_cuda(None, None) is None
    assert _dynamic_blocks(q.quant_config("nvfp4", None, None))
    assert _dynamic_blocks(q.quant_config(None, "nvfp4", None))
    model = q.load_model(models["llama"], "bfloat16", "cpu")
    with pytest.raises(InvalidInput, match="cannot quantize on cpu: quantization nvfp4"):
        q.calibrate_and_quantize(model, "nvfp4", None, None, windows, "cpu")


# ------------------------------------------------------------------------------------------------
# Quantize + export


CASES = [(arch, quant, kv) for arch in ARCHS for quant in CPU_FORMATS for kv in (None, "fp8")]


@pytest.mark.parametrize("arch,quant,kv", CASES, ids=[f"{a}-{qq}-{k or 'nokv'}" for a, qq, k in CASES])
def test_quantize_and_export(arch, quant, kv, quantized, models, tmp_path):
    model, report, logits = quantized(arch, quant, kv)
    assert report["batch_size"] == SAMPLES and report["windows"] == SAMPLES
    assert report["awq_statistics"] == ("float64 per-window activation sums" if "awq" in quant else None)
    assert report["passes"] == (2 if "awq" in quant else 1)
    assert report["peak_rss_bytes"] > 0 and report["cuda_peak_bytes"] is None
    assert report["changed_weights_unexplained"] == 0

    for tp in (1, 2):
        out = tmp_path / f"trt{tp}"
        result = q.export_trtllm(model, out, tp, 1, "bfloat16")
        config = json.loads((out / "config.json").read_text())
        assert result["decoder_type"] == config["decoder"] == ("qwen" if arch == "qwen2" else "llama")
        assert sorted(p.name for p in out.glob("rank*.safetensors")) == [f"rank{r}.safetensors" for r in range(tp)]
        assert config["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
        quantization = config["quantization"]
        assert quantization["quant_algo"] == FORMATS[quant].quant_algo
        assert quantization["kv_cache_quant_algo"] == (KV_FORMATS[kv].quant_algo if kv else None)
        if quant in ("int4_awq", "w4a8_awq", "int4_wo"):  # the grouped formats, named here, not read from q
            assert quantization["group_size"] == GROUP and quantization["pre_quant_scale"] is True
        assert config["rotary_base"] == (1e6 if arch == "qwen2" else 10000.0)
        if arch == "qwen2":
            assert config["qwen_type"] == "qwen2" and config["attn_bias"] is True
        dtypes = _tensor_dtypes(out / "rank0.safetensors")
        qkv = "transformer.layers.0.attention.qkv"
        assert dtypes[f"{qkv}.weight"] == ("F8_E4M3" if quant == "fp8" else "I8")
        assert dtypes["transformer.vocab_embedding.weight"] == "BF16"
        if FORMATS[quant].grouped or quant == "int8_sq":
            # W4A16_AWQ/W4A8_AWQ/SQ layers need it; int4_wo gets ones (TRT-LLM requires the tensor).
            for layer in ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj"):
                assert f"transformer.layers.1.{layer}.prequant_scaling_factor" in dtypes
        if kv:
            assert dtypes["transformer.layers.0.attention.kv_cache_scaling_factor"] == "F32"

    hf = tmp_path / "hf"
    result = q.export_hf(model, hf, models[arch])
    config = json.loads((hf / "config.json").read_text())
    assert config["quantization_config"]["quant_algo"] == HF_QUANT_ALGO[quant]
    hf_quant = json.loads((hf / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == HF_QUANT_ALGO[quant] == result["quant_algo"]
    assert hf_quant["kv_cache_quant_algo"] == ("FP8" if kv else None)
    if kv:
        assert config["quantization_config"]["kv_cache_scheme"]["type"] == "float"
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (hf / name).read_bytes() == (models[arch] / name).read_bytes()
    dtypes = _tensor_dtypes(hf / "model.safetensors")
    float32 = {k.rsplit(".", 1)[-1] for k, v in dtypes.items() if v == "F32"}
    assert float32 <= set(q.HF_FLOAT32_BY_DESIGN)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert dtypes[name] == "BF16"

    # Neither export changed the quantized model.
    assert torch.equal(_logits(model, quantized.test_ids), logits)


def test_hf_export_float32_tensors_are_scales(quantized, models, tmp_path):
    """A bf16 model's unified HF checkpoint: everything is bf16 or quantized, except the scales
    ModelOpt keeps float32 by design: weight_scale, input_scale, k_scale, v_scale (and
    weight_scale_2 for W4A8). pre_quant_scale is bf16."""
    seen = {}
    for quant, kv in (("fp8", "fp8"), ("int8_sq", None), ("w4a8_awq", "fp8"), ("int4_wo", None)):
        model, _, _ = quantized("llama", quant, kv)
        q.export_hf(model, tmp_path / f"{quant}-{kv}", models["llama"])
        dtypes = _tensor_dtypes(tmp_path / f"{quant}-{kv}" / "model.safetensors")
        seen[quant] = sorted({k.rsplit(".", 1)[-1] for k, v in dtypes.items() if v == "F32"})
        unquantized = {k: v for k, v in dtypes.items() if k.rsplit(".", 1)[-1] not in q.HF_FLOAT32_BY_DESIGN}
        assert set(unquantized.values()) <= {"BF16", "F8_E4M3", "I8", "U8"}
    assert seen == {"fp8": ["input_scale", "k_scale", "v_scale", "weight_scale"],
                    "int8_sq": ["input_scale", "weight_scale"],
                    "w4a8_awq": ["input_scale", "k_scale", "v_scale", "weight_scale", "weight_scale_2"],
                    "int4_wo": ["weight_scale"]}


def test_kv_cache_only_and_int8_kv(quantized, models, tmp_path):
    model, report, _ = quantized("llama", None, "fp8")
    assert report["changed_weights"] == 0
    q.export_trtllm(model, tmp_path / "kvonly", 1, 1, "bfloat16")
    quantization = json.loads((tmp_path / "kvonly" / "config.json").read_text())["quantization"]
    assert quantization["quant_algo"] is None and quantization["kv_cache_quant_algo"] == "FP8"

    model, _, _ = quantized("llama", "int8_wo", "int8")
    q.export_trtllm(model, tmp_path / "int8kv", 2, 1, "bfloat16")
    quantization = json.loads((tmp_path / "int8kv" / "config.json").read_text())["quantization"]
    assert quantization["quant_algo"] == "W8A16" and quantization["kv_cache_quant_algo"] == "INT8"
    with pytest.raises(InvalidInput, match="kv_cache int8: .*only fp8 and nvfp4"):
        q.export_hf(model, tmp_path / "hf", models["llama"])


def test_export_trtllm_pipeline_parallel(quantized, tmp_path):
    model, _, _ = quantized("llama", "fp8", "fp8")
    result = q.export_trtllm(model, tmp_path / "pp", 1, 2, "float16")
    config = json.loads((tmp_path / "pp" / "config.json").read_text())
    assert config["mapping"] == {"world_size": 2, "tp_size": 1, "pp_size": 2} and config["dtype"] == "float16"
    assert result["files"] == ["config.json", "rank0.safetensors", "rank1.safetensors"]


# ------------------------------------------------------------------------------------------------
# Save / restore


@pytest.mark.parametrize("arch,quant,kv", [("llama", "int8_sq", None), ("llama", "int4_awq", None),
                                           ("llama", "w4a8_awq", "fp8"), ("llama", "fp8", "fp8"),
                                           ("llama", "int4_wo", None), ("qwen2", "int4_awq", "fp8"),
                                           ("mistral", "int8_sq", "fp8")])
def test_restore_is_exact(arch, quant, kv, quantized, models, tmp_path):
    model, report, logits = quantized(arch, quant, kv)
    manifest = q.save_quantized(model, tmp_path / "state")
    changed = manifest["changed_weights"]
    if quant in ("int8_sq", "int4_awq", "w4a8_awq"):
        # SmoothQuant and AWQ fold their scales into every quantized Linear weight in place ...
        assert report["changed_weights"] == len(changed) == QUANTIZED_LINEARS
        assert all(len(how["replay"]) == 2 and how["replay"][0] != how["replay"][1] for how in changed.values())
    else:
        assert changed == {}
    # ... and the state replays them from one fp32 vector per Linear: no weights are stored.
    assert _tensor_dtypes(tmp_path / "state" / "weights.safetensors") == {}
    assert manifest["bytes"] < manifest["model_bytes"] / 4

    restored = q.restore_quantized(models[arch], tmp_path / "state", "bfloat16", "cpu")
    assert torch.equal(_logits(restored, quantized.test_ids), logits)
    for (name, a), (name_b, b) in zip(model.state_dict().items(), restored.state_dict().items()):
        assert name == name_b and torch.equal(a, b), name
    # A restored model saves the same state again.
    again = q.save_quantized(restored, tmp_path / "again")
    assert again["quantized_sha256"] == manifest["quantized_sha256"] and again["changed_weights"] == changed
    for name in ("quantizers.safetensors", "scales.safetensors", "weights.safetensors"):
        assert again["files"][name] == manifest["files"][name]


SAVE_IN_A_FRESH_PROCESS = """
import sys
import numpy as np
from trtbuild.checkpoint import quantize as q
model = q.load_model(sys.argv[1], "bfloat16", "cpu")
q.calibrate_and_quantize(model, "fp8", "fp8", None, np.load(sys.argv[2]), "cpu")
q.save_quantized(model, sys.argv[3])
"""


def test_the_saved_state_is_the_same_bytes_in_every_process(models, windows, tmp_path):
    """An artifact is a function of its key's inputs: two processes (two hash seeds, which order
    the sets ModelOpt builds its state from) save byte-identical files."""
    import subprocess
    import sys

    np.save(tmp_path / "windows.npy", windows)
    for seed in ("1", "2"):
        subprocess.run([sys.executable, "-c", SAVE_IN_A_FRESH_PROCESS, str(models["llama"]), str(tmp_path / "windows.npy"),
                        str(tmp_path / seed)], check=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=600)
    files = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "2").iterdir()) and "modelopt_state.pth" in files
    assert [f for f in files if (tmp_path / "1" / f).read_bytes() != (tmp_path / "2" / f).read_bytes()] == []


FIRST_IMPORT_IN_A_FRESH_PROCESS = """
import gc, sys, weakref
import numpy as np
from trtbuild.checkpoint import quantize as q
model = q.load_model(sys.argv[1], "bfloat16", "cpu")
assert "modelopt.torch.opt" not in sys.modules  # imported by calibrate_and_quantize, on its stack
q.calibrate_and_quantize(model, "fp8", None, None, np.load(sys.argv[2]), "cpu")
kept = weakref.ref(model)
del model
gc.collect()
print("kept" if kept() is not None else "freed")
"""


def test_importing_modelopt_keeps_no_model(models, windows, tmp_path):
    """ModelOpt's first import in a process keeps nothing of its caller: pulp (which ModelOpt
    imports) keeps each missing solver's ImportError with its traceback, whose frames hold their
    callers'; imported on calibrate_and_quantize's stack, that kept the first model a shared worker
    quantized (a whole model of memory) until the worker ended. A fresh process: here ModelOpt is
    imported already."""
    import subprocess
    import sys

    np.save(tmp_path / "windows.npy", windows)
    result = subprocess.run([sys.executable, "-c", FIRST_IMPORT_IN_A_FRESH_PROCESS, str(models["llama"]),
                             str(tmp_path / "windows.npy")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "freed"


def test_other_weight_changes_are_stored_in_full(quantized, models, tmp_path):
    """A weight changed in place by anything but the recorded rescale is saved whole."""
    model, _, _ = quantized("llama", "int8_sq", None)
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight[3, 5] += 1
        model.model.layers[0].mlp.up_proj.weight[0, 0] += 1  # on top of the SmoothQuant rescale
    manifest = q.save_quantized(model, tmp_path / "state")
    stored = sorted(k for k, how in manifest["changed_weights"].items() if how.get("stored"))
    assert stored == ["lm_head.weight", "model.layers.0.mlp.up_proj.weight"]
    assert sorted(_tensor_dtypes(tmp_path / "state" / "weights.safetensors")) == stored
    restored = q.restore_quantized(models["llama"], tmp_path / "state", "bfloat16", "cpu")
    assert torch.equal(_logits(restored, quantized.test_ids), _logits(model, quantized.test_ids))


def test_restore_rejects_other_source_and_dtype(quantized, models, tmp_path):
    model, _, _ = quantized("llama", "int8_sq", None)
    q.save_quantized(model, tmp_path / "state")
    other = tmp_path / "other"
    shutil.copytree(models["llama"], other)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(other / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = tensors[name].clone()
    tensors[name][0, 0] += 1
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InvalidInput,
                       match=r"not the checkpoint .* \(1 of 21 parameters differ, e.g. model.layers.1.mlp.down_proj"):
        q.restore_quantized(other, tmp_path / "state", "bfloat16", "cpu")
    with pytest.raises(InvalidInput, match="quantized in bfloat16, cannot restore in float16"):
        q.restore_quantized(models["llama"], tmp_path / "state", "float16", "cpu")


# ------------------------------------------------------------------------------------------------
# Batching and progress


@pytest.mark.parametrize("quant,kv", [("fp8", "fp8"), ("int8_sq", None), ("int8_wo", None), ("int4_wo", None)])
def test_max_calibration_is_batch_size_independent_bit_for_bit(quant, kv, models, windows, quantized):
    """The batch size follows the memory available and is not in the key, so max calibration
    must give the same quantized model, bit for bit, in batches of 2 as in one batch of 8:
    every weight (SmoothQuant rescales them in place) and every quantizer buffer (amax,
    pre_quant_scale)."""
    ref, report8, _ = quantized("llama", quant, kv)
    assert report8["batch_size"] == SAMPLES
    events = []
    model = q.load_model(models["llama"], "bfloat16", "cpu")
    report = q.calibrate_and_quantize(model, quant, kv, GROUP, windows, "cpu",
                                      progress=lambda done, total: events.append((done, total)), max_batch=3)
    assert report["batch_size"] == 2 and report["batches"] == 4  # the largest divisor of 8 <= 3
    assert events == [(1, 4), (2, 4), (3, 4), (4, 4)]
    state, ref_state = model.state_dict(), ref.state_dict()
    assert state.keys() == ref_state.keys() and any(k.endswith("_amax") for k in state)
    assert [k for k in state if not torch.equal(state[k], ref_state[k])] == []


@pytest.mark.parametrize("quant", ["int4_awq", "w4a8_awq"])
def test_awq_is_batch_size_independent_bit_for_bit(quant, models, windows, quantized, capsys):
    """AWQ batches too: its activation means are summed per window in float64, so batches of 1
    and of 2 give the model that one batch of 8 gives, bit for bit (every weight and quantizer
    buffer, pre_quant_scale included), in two passes (caching statistics, then the alpha search)."""
    ref, report8, _ = quantized("llama", quant, None)
    assert report8["batch_size"] == SAMPLES and report8["batches"] == 2
    ref_state = ref.state_dict()
    assert any(k.endswith("_pre_quant_scale") for k in ref_state)
    for cap, size in ((1, 1), (3, 2)):
        events = []
        model = q.load_model(models["llama"], "bfloat16", "cpu")
        report = q.calibrate_and_quantize(model, quant, None, GROUP, windows, "cpu",
                                          progress=lambda done, total: events.append((done, total)), max_batch=cap)
        batches = SAMPLES // size
        assert (report["batch_size"], report["batches"], report["passes"]) == (size, 2 * batches, 2)
        assert events == [(i, 2 * batches) for i in range(1, 2 * batches + 1)]
        log = capsys.readouterr().out
        assert f"pass 1 (awq_lite: caching activation statistics): {batches} batches of {size} windows" in log
        assert "pass 2 (awq_lite: searching" in log and f"batch {batches}/{batches}" in log
        state = model.state_dict()
        assert state.keys() == ref_state.keys()
        assert [k for k in state if not torch.equal(state[k], ref_state[k])] == [], (cap, size)
        assert not any(module._forward_pre_hooks for module in model.modules())  # the statistics' hooks are gone