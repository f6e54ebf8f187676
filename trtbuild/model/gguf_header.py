"""A GGUF file's header (metadata and tensor shapes) and the Hugging Face config it implies, read
for planning: the bytes up to the tensor data, decoded by the GGUF format's value types (numbers the
format fixes, written out here: importing the `gguf` package for them pulls in numpy, 0.15 s of
every `trtbuild plan`; tests/test_gguf_source.py checks them against the package).

The package's own GGUFReader builds numpy views of every element of every array: about 5 s for
SmolLM2's 49k tokens and 49k merges, and more for larger vocabularies. Planning needs only scalars
and the arrays' lengths, so this walk skips array contents (tests check it agrees with GGUFReader)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.errors import InvalidInput

_VERSIONS = (2, 3)  # gguf_reader.READER_SUPPORTED_VERSIONS: v1 used 32-bit counts
_SMALL_ARRAY = 1024  # numeric arrays up to this length are decoded (per-layer values); longer ones are not


@dataclass(frozen=True)
class GGUFArray:
    """An array value: its length always, its items when it is short and numeric."""

    length: int
    items: tuple | None = None


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # key -> int, float, bool, str or GGUFArray
    tensors: dict[str, tuple[int, ...]]  # name -> dims as GGUF stores them (fastest-varying first)
    tensor_types: dict[str, int] = field(default_factory=dict)  # name -> its ggml type (gguf.GGMLQuantizationType)


class _Cursor:
    def __init__(self, buf, order: str):
        self.buf, self.order, self.offset = buf, order, 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.buf):
            raise ValueError(f"the file ends at byte {len(self.buf)}, inside the header")
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.offset)
        self.offset += size
        return value

    def many(self, fmt: str, count: int) -> tuple:
        size = struct.calcsize(fmt) * count
        if self.offset + size > len(self.buf):
            raise ValueError(f"the file ends at byte {len(self.buf)}, inside the header")
        values = struct.unpack_from(f"{self.order}{count}{fmt}", self.buf, self.offset)
        self.offset += size
        return values

    def skip(self, size: int) -> None:
        if self.offset + size > len(self.buf):
            raise ValueError(f"the file ends at byte {len(self.buf)}, inside the header")
        self.offset += size

    def skip_strings(self, count: int) -> None:
        # The hot loop (a vocabulary's tokens and merges): plain locals, no per-item method calls.
        length, buf, offset, end = struct.Struct(self.order + "Q").unpack_from, self.buf, self.offset, len(self.buf)
        for _ in range(count):
            if offset + 8 > end:
                raise ValueError(f"the file ends at byte {end}, inside the header")
            offset += 8 + length(buf, offset)[0]
        if offset > end:
            raise ValueError(f"the file ends at byte {end}, inside the header")
        self.offset = offset

    def string(self) -> str:
        size = self.unpack("Q")
        start = self.offset
        self.skip(size)
        return bytes(self.buf[start:self.offset]).decode("utf-8", errors="replace")


GGUF_MAGIC = 0x46554747  # b"GGUF", read little-endian
# The format's value types (gguf.GGUFValueType) and the struct codes of the numeric ones.
STRING, ARRAY = 8, 9
FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _value(cur: _Cursor, kind: int, formats: dict[int, str], string: int, array: int) -> Any:
    if kind in formats:
        return cur.unpack(formats[kind])
    if kind == string:
        return cur.string()
    if kind == array:
        item_kind, length = cur.unpack("I"), cur.unpack("Q")
        if item_kind in formats:
            fmt = formats[item_kind]
            if length <= _SMALL_ARRAY:
                return GGUFArray(length, cur.many(fmt, length))
            cur.skip(length * struct.calcsize(fmt))
        elif item_kind == string:
            cur.skip_strings(length)
        else:  # arrays of arrays: walk them
            for _ in range(length):
                _value(cur, item_kind, formats, string, array)
        return GGUFArray(length)
    raise ValueError(f"unknown value type {kind} before byte {cur.offset}")


def read_header(path: Path) -> GGUFHeader:
    """Metadata and tensor shapes; one-line InvalidInput naming the file when it is not a GGUF."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            start = f.read(8)
            if len(start) < 8 or struct.unpack_from("<I", start, 0)[0] != GGUF_MAGIC:
                raise InvalidInput(f"{path}: not a GGUF file (no GGUF magic)")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with buf:
            # A version whose low half is zero was written in the other byte order (as GGUFReader reads it).
            order = ">" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF == 0 else "<"
            cur = _Cursor(buf, order)
            cur.skip(4)
            version = cur.unpack("I")
            if version not in _VERSIONS:
                raise InvalidInput(f"{path}: GGUF version {version} is not supported (only {', '.join(map(str, _VERSIONS))})")
            tensor_count, kv_count = cur.unpack("Q"), cur.unpack("Q")
            metadata = {}
            for _ in range(kv_count):
                key = cur.string()
                metadata[key] = _value(cur, cur.unpack("I"), FORMATS, STRING, ARRAY)
            tensors, tensor_types = {}, {}
            for _ in range(tensor_count):
                name = cur.string()
                dims = cur.unpack("I")
                tensors[name] = tuple(cur.unpack("Q") for _ in range(dims))
                tensor_types[name] = cur.unpack("I")
                cur.skip(8)  # data offset
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such file") from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, struct.error) as exc:  # a truncated or garbled header
        raise InvalidInput(f"{path}: malformed GGUF header ({exc})") from None
    return GGUFHeader(path, version, metadata, tensors, tensor_types)


# general.architecture -> (HF class, model_type, hidden_act, where head_dim is stated): the dense
# families transformers' GGUF loader turns into configs (integrations/ggml.py GGUF_CONFIG_MAPPING),
# named the way that loader names them, so plan reads what the source stage will write.
_FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama", "silu", "rope.dimension_count"),
    "mistral": ("MistralForCausalLM", "mistral", "silu", "rope.dimension_count"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", "silu", None),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", "silu", None),
    "phi3": ("Phi3ForCausalLM", "phi3", "silu", None),
    "gemma2": ("Gemma2ForCausalLM", "gemma2", "gelu_pytorch_tanh", "attention.key_length"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", "gelu_pytorch_tanh", "attention.key_length"),
}
# general.file_type values whose tensors are one float dtype (gguf.LlamaFileType); quantized files have none.
_FILE_DTYPES = {0: "float32", 1: "float16", 32: "bfloat16"}


def hf_config(header: GGUFHeader) -> dict:
    """The config.json fields planning reads, from the header's `{arch}.*` keys: what transformers
    derives when it loads the GGUF (vocab_size from the token list when the header has no
    `{arch}.vocab_size`; tied embeddings when there is no output.weight tensor)."""
    where = f"GGUF header of {header.path}"
    meta = header.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise InvalidInput(f"{where}: no general.architecture")
    if arch not in _FAMILIES:
        raise InvalidInput(f"{where}: architecture {arch!r} is not one trtbuild reads from a GGUF "
                           f"({', '.join(_FAMILIES)}); set source.config to the model's config.json")
    hf_class, model_type, act, head_dim_key = _FAMILIES[arch]
    if meta.get(f"{arch}.expert_count"):
        raise InvalidInput(f"{where}: {arch}.expert_count {meta[f'{arch}.expert_count']}: mixture-of-experts "
                           "GGUF files are not read (transformers loads them as dense models)")

    def value(name: str, required: bool = True):
        key = f"{arch}.{name}"
        found = meta.get(key)
        if found is None and required:
            raise InvalidInput(f"{where}: no {key} (needed to plan)")
        if isinstance(found, GGUFArray):
            raise InvalidInput(f"{where}: {key} varies per layer; set source.config to the model's config.json")
        return found

    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = value("vocab_size", required=False) or (tokens.length if isinstance(tokens, GGUFArray) else None)
    if vocab is None:
        raise InvalidInput(f"{where}: neither {arch}.vocab_size nor tokenizer.ggml.tokens (needed to plan)")
    heads = value("attention.head_count")
    config = {
        "architectures": [hf_class],
        "model_type": model_type,
        "hidden_act": act,
        "hidden_size": value("embedding_length"),
        "num_hidden_layers": value("block_count"),
        "intermediate_size": value("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": value("attention.head_count_kv", required=False) or heads,
        "max_position_embeddings": value("context_length", required=False),
        "rope_theta": value("rope.freq_base", required=False),
        "rms_norm_eps": value("attention.layer_norm_rms_epsilon", required=False),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in header.tensors,
        "torch_dtype": _FILE_DTYPES.get(meta.get("general.file_type")),
    }
    if head_dim_key and value(head_dim_key, required=False):
        config["head_dim"] = value(head_dim_key)
    scaling = value("rope.scaling.type", required=False)
    if scaling and scaling != "none":
        config["rope_scaling"] = {"rope_type": scaling, "factor": value("rope.scaling.factor", required=False) or 1.0,
                                  "original_max_position_embeddings": value("rope.scaling.original_context_length",
                                                                            required=False)}
    return {k: v for k, v in config.items() if v is not None}
