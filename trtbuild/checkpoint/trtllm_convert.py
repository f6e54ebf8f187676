"""Stream an unquantized Hugging Face LLaMA-family checkpoint into a TensorRT-LLM checkpoint.

The model is never loaded. Every output tensor of every rank is planned first (name, shape, dtype
and the source slices it is made of), so the safetensors header of `rank{N}.safetensors` can be
written before any data; the data then follows piece by piece, each piece read with
`safetensors.safe_open(...).get_slice(...)` in row blocks of at most `chunk_bytes`. One rank is
written at a time and only the slices that rank needs are read, so peak memory is about one row
block (2-3 x `chunk_bytes`, 64 MiB by default), not one tensor and never one rank, whatever the model
size (measured: +22 MiB peak RSS for a 240 MiB model at TP2; a 70B model was not tried).

Why row blocks and a handle per read: safetensors >= 0.8 returns *views* of a memory map, and every
page a slice touches stays resident (and counts in RSS/VmHWM) until the map is dropped. A
column slice `[:, a:b]` of a row-major matrix touches every row. So each read opens the file,
copies one block of whole source rows' worth of bytes into a fresh tensor (converting the dtype on
the way) and closes it again; the `"pread"` backend is no help, it reads the whole tensor for any
slice.

The layout it writes (reference/trtllm.md section 2, checked tensor for tensor against ModelOpt
0.47's export in tests/test_trtllm_convert.py) is described in docs/checkpoints.md.
"""

from __future__ import annotations

import json
import os
import re
import resource
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from trtbuild import __version__
from trtbuild.checkpoint.hf_layout import HFLayout, check_parallel, hf_layout, kv_rows, normalize_dtype
from trtbuild.checkpoint.safetensors_files import ST_CODE, ST_ITEMSIZE, read_safetensors_header, weight_files
from trtbuild.checkpoint.trtllm_config import build_trtllm_config
from trtbuild.errors import InvalidInput
from trtbuild.model.config import padded_vocab, read_json_object

DEFAULT_CHUNK_BYTES = 64 << 20


# --------------------------------------------------------------------------------------------
# Source checkpoint and the per-rank plan
# --------------------------------------------------------------------------------------------

class _Source:
    """The tensors of a HF safetensors folder (single file, or sharded with an index)."""

    def __init__(self, folder: Path) -> None:
        self.entries: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
        for name in weight_files(folder):
            path = folder / name
            for key, info in read_safetensors_header(path).items():
                self.entries[key] = (path, str(info["dtype"]), tuple(int(d) for d in info["shape"]))

    def has(self, name: str) -> bool:
        return name in self.entries

    def shape(self, name: str, expected: tuple[int, ...]) -> tuple[int, ...]:
        if name not in self.entries:
            raise InvalidInput(f"source checkpoint: tensor {name} is missing (expected shape {list(expected)})")
        found, st_dtype = self.entries[name][2], self.entries[name][1]
        if st_dtype not in ("BF16", "F16", "F32"):
            raise InvalidInput(f"source checkpoint: {name} is {st_dtype}; only unquantized (float) checkpoints "
                               f"can be converted (quantize with ModelOpt instead)")
        if found != tuple(expected):
            raise InvalidInput(f"source checkpoint: {name}: expected shape {list(expected)} from config.json, "
                               f"found {list(found)}")
        return found

    def read(self, name: str, rows: tuple[int, int], cols: Optional[tuple[int, int]], dtype):
        import torch
        from safetensors import safe_open

        path = self.entries[name][0]
        # A handle per read: the tensors safe_open returns are views of its memory map, and the
        # map (with every page touched) lives until the handle and the views are gone.
        with safe_open(str(path), framework="pt") as f:
            view = f.get_slice(name)
            part = view[rows[0]:rows[1]] if cols is None else view[rows[0]:rows[1], cols[0]:cols[1]]
            out = part.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
            del part, view
        return out


@dataclass(frozen=True)
class _Slice:
    name: str
    rows: Optional[tuple[int, int]] = None  # on dim 0; None = all
    cols: Optional[tuple[int, int]] = None  # on dim 1 (2-D sources only); None = all


@dataclass(frozen=True)
class _Zeros:
    shape: tuple[int, ...]


@dataclass
class _Out:
    name: str
    shape: tuple[int, ...]
    dtype: str  # float16 / bfloat16 / float32
    pieces: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * ST_ITEMSIZE[ST_CODE[self.dtype]]


class _Planner:
    def __init__(self, layout: HFLayout, src: _Source, tp: int, pp: int, dtype: str) -> None:
        self.L, self.src, self.tp, self.pp, self.dtype = layout, src, tp, pp, dtype

    def whole(self, dst: str, name: str, shape: tuple[int, ...], dtype: Optional[str] = None) -> _Out:
        self.src.shape(name, shape)
        return _Out(dst, shape, dtype or self.dtype, [_Slice(name)])

    def column(self, dst: str, name: str, full: tuple[int, ...], t: int) -> _Out:
        """Split on dim 0 (column-parallel linear, or its bias)."""
        self.src.shape(name, full)
        per = full[0] // self.tp
        return _Out(dst, (per,) + full[1:], self.dtype, [_Slice(name, (t * per, (t + 1) * per))])

    def row(self, dst: str, name: str, full: tuple[int, int], t: int) -> _Out:
        """Split on dim 1 (row-parallel linear)."""
        self.src.shape(name, full)
        per = full[1] // self.tp
        return _Out(dst, (full[0], per), self.dtype, [_Slice(name, None, (t * per, (t + 1) * per))])

    def vocab(self, dst: str, name: str, t: int) -> _Out:
        """Embedding / lm_head: vocab zero-padded to a multiple of tp, split on dim 0."""
        V, H = self.L.vocab, self.L.hidden
        self.src.shape(name, (V, H))
        per = padded_vocab(V, self.tp) // self.tp
        start, stop = t * per, min((t + 1) * per, V)
        pieces: list = []
        if stop > start:
            pieces.append(_Slice(name, (start, stop)))
        if per - max(stop - start, 0):
            pieces.append(_Zeros((per - max(stop - start, 0), H)))
        return _Out(dst, (per, H), self.dtype, pieces)

    def rank(self, rank: int) -> list[_Out]:
        L, tp = self.L, self.tp
        t, p = rank % tp, rank // tp
        per_stage = L.num_layers // self.pp
        first = p * per_stage
        outs: list[_Out] = []
        if p == 0:
            outs.append(self.vocab("transformer.vocab_embedding.weight", "model.embed_tokens.weight", t))
        for layer in range(first, first + per_stage):
            outs += self.layer(layer, layer - first, t)
        if p == self.pp - 1:
            outs.append(self.whole("transformer.ln_f.weight", "model.norm.weight", (L.hidden,)))
            head = "lm_head.weight"
            if L.tied or not self.src.has(head):
                if not L.tied:
                    raise InvalidInput("source checkpoint: tensor lm_head.weight is missing and "
                                       "tie_word_embeddings is false")
                head = "model.embed_tokens.weight"
            outs.append(self.vocab("lm_head.weight", head, t))
        return outs

    def layer(self, layer: int, local: int, t: int) -> list[_Out]:
        L, tp = self.L, self.tp
        s, d = f"model.layers.{layer}.", f"transformer.layers.{local}."
        H, hd = L.hidden, L.head_dim
        q_full, kv_full = L.heads * hd, L.kv_heads * hd
        q_per = q_full // tp
        k0, k1 = kv_rows(L, t, tp)
        outs = [self.whole(d + "input_layernorm.weight", s + "input_layernorm.weight", (H,))]

        names = {x: f"{s}self_attn.{x}_proj" for x in "qkvo"}
        for x, rows in (("q", q_full), ("k", kv_full), ("v", kv_full)):
            self.src.shape(names[x] + ".weight", (rows, H))
        qkv_rows = q_per + 2 * (k1 - k0)
        outs.append(_Out(d + "attention.qkv.weight", (qkv_rows, H), self.dtype, [
            _Slice(names["q"] + ".weight", (t * q_per, (t + 1) * q_per)),
            _Slice(names["k"] + ".weight", (k0, k1)),
            _Slice(names["v"] + ".weight", (k0, k1)),
        ]))
        if L.qkv_bias:
            for x, rows in (("q", q_full), ("k", kv_full), ("v", kv_full)):
                self.src.shape(names[x] + ".bias", (rows,))
            outs.append(_Out(d + "attention.qkv.bias", (qkv_rows,), self.dtype, [
                _Slice(names["q"] + ".bias", (t * q_per, (t + 1) * q_per)),
                _Slice(names["k"] + ".bias", (k0, k1)),
                _Slice(names["v"] + ".bias", (k0, k1)),
            ]))
        outs.append(self.row(d + "attention.dense.weight", names["o"] + ".weight", (H, q_full), t))
        if L.dense_bias:  # row-parallel: the bias is added once, after the all-reduce
            outs.append(self.whole(d + "attention.dense.bias", names["o"] + ".bias", (H,)))
        outs.append(self.whole(d + "post_layernorm.weight", s + "post_attention_layernorm.weight", (H,)))

        I = L.intermediate
        if L.num_experts:
            E, per = L.num_experts, I // tp
            moe = s + "block_sparse_moe."
            outs.append(self.whole(d + "mlp.router.weight", moe + "gate.weight", (E, H), dtype="float32"))
            fc, proj = [], []
            for e in range(E):
                w1, w2, w3 = (f"{moe}experts.{e}.w{i}.weight" for i in (1, 2, 3))
                self.src.shape(w1, (I, H))
                self.src.shape(w3, (I, H))
                self.src.shape(w2, (H, I))
                fc += [_Slice(w3, (t * per, (t + 1) * per)), _Slice(w1, (t * per, (t + 1) * per))]
                proj.append(_Slice(w2, None, (t * per, (t + 1) * per)))
            outs.append(_Out(d + "mlp.fc.weight", (E, 2 * per, H), self.dtype, fc))
            outs.append(_Out(d + "mlp.proj.weight", (E, H, per), self.dtype, proj))
        else:
            mlp = s + "mlp."
            outs.append(self.column(d + "mlp.fc.weight", mlp + "gate_proj.weight", (I, H), t))
            outs.append(self.column(d + "mlp.gate.weight", mlp + "up_proj.weight", (I, H), t))
            outs.append(self.row(d + "mlp.proj.weight", mlp + "down_proj.weight", (H, I), t))
            if L.mlp_bias:
                outs.append(self.column(d + "mlp.fc.bias", mlp + "gate_proj.bias", (I,), t))
                outs.append(self.column(d + "mlp.gate.bias", mlp + "up_proj.bias", (I,), t))
                outs.append(self.whole(d + "mlp.proj.bias", mlp + "down_proj.bias", (H,)))
        return outs


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

def _blocks(src: _Source, piece, torch_dtype, itemsize: int, chunk_bytes: int) -> Iterator:
    import torch

    if isinstance(piece, _Zeros):
        rows, rest = piece.shape[0], piece.shape[1:]
        width = 1
        for d in rest:
            width *= d
        step = max(1, chunk_bytes // max(1, width * itemsize))
        for r0 in range(0, rows, step):
            yield torch.zeros((min(step, rows - r0),) + tuple(rest), dtype=torch_dtype)
        return
    _, st_dtype, shape = src.entries[piece.name]
    a, b = piece.rows or (0, shape[0])
    # Block height from the *source* row width: a column slice touches whole source rows.
    width = 1
    for d in shape[1:]:
        width *= d
    step = max(1, chunk_bytes // max(1, width * ST_ITEMSIZE.get(st_dtype, 4)))
    for r0 in range(a, b, step):
        yield src.read(piece.name, (r0, min(b, r0 + step)), piece.cols, torch_dtype)


def _write_rank(path: Path, outs: list[_Out], src: _Source, chunk_bytes: int,
                progress: Optional[Callable[[int], None]]) -> int:
    """Write one safetensors file: header first (all shapes are known), then the data in order."""
    import torch

    torch_dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "producer": f"trtbuild {__version__}"}}
    offset = 0
    for out in outs:
        header[out.name] = {"dtype": ST_CODE[out.dtype], "shape": list(out.shape),
                            "data_offsets": [offset, offset + out.nbytes]}
        offset += out.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)  # the data section starts 8-byte aligned
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for out in outs:
            dt = torch_dtypes[out.dtype]
            itemsize = ST_ITEMSIZE[ST_CODE[out.dtype]]
            written = 0
            for piece in out.pieces:
                for block in _blocks(src, piece, dt, itemsize, chunk_bytes):
                    data = block.reshape(-1).view(torch.uint8).numpy()
                    f.write(memoryview(data))
                    written += data.nbytes
                    if progress is not None:
                        progress(data.nbytes)
                    del data, block
            if written != out.nbytes:  # a planning bug, never a user error
                raise AssertionError(f"{path.name}: {out.name}: wrote {written} bytes, planned {out.nbytes}")
    os.replace(partial, path)
    return 8 + len(raw) + offset


def _rss_now() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def convert_hf_to_trtllm(src: Union[Path, str], out: Union[Path, str], tp: int, pp: int, dtype: str,
                         progress: Optional[Callable[[int, int], None]] = None, *,
                         chunk_bytes: int = DEFAULT_CHUNK_BYTES, quant: Optional[str] = None) -> dict:
    """Convert the unquantized HF checkpoint folder `src` into a TensorRT-LLM checkpoint in `out`.

    `quant`: a recipe format TensorRT-LLM quantizes itself at load (int8_wo): the weights are
    written as floats all the same, and config.json says its quant_algo (W8A16).

    `progress`, if given, is called after each block with (bytes written so far, bytes in all).
    Returns a report: per-rank tensor counts and bytes,
    seconds, and peak RSS (resource.getrusage, the whole process's high-water mark)."""
    from trtbuild.facts.quantformats import FORMATS, trtllm_loadtime_algo

    started = time.monotonic()
    rss_start = _rss_now()
    src, out = Path(src), Path(out)
    if quant is not None and (quant not in FORMATS or trtllm_loadtime_algo(quant) is None):
        loadtime = [name for name in FORMATS if trtllm_loadtime_algo(name)]
        raise InvalidInput(f"quant {quant!r}: the streaming converter writes only the formats TensorRT-LLM quantizes "
                           f"at load ({', '.join(loadtime)}); others are exported by ModelOpt")
    quant_algo = trtllm_loadtime_algo(quant)
    hf = read_json_object(src / "config.json")
    if hf.get("quantization_config"):
        raise InvalidInput(f"{src / 'config.json'}: has a quantization_config; the streaming converter takes "
                           f"unquantized checkpoints only")
    layout = hf_layout(hf, str(src / "config.json"))
    dtype = normalize_dtype(dtype, layout)
    check_parallel(layout, tp, pp, str(src / "config.json"))
    source = _Source(src)
    planner = _Planner(layout, source, tp, pp, dtype)
    world = tp * pp
    plans = [planner.rank(r) for r in range(world)]  # validates every source shape before writing

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.safetensors*"):  # leftovers of an earlier, larger mapping or a crash
        m = re.match(r"^rank(\d+)\.safetensors(\.partial)?$", stale.name)
        if m and (m.group(2) or int(m.group(1)) >= world):
            stale.unlink()
    (out / "config.json").unlink(missing_ok=True)  # written last: its presence marks a finished checkpoint

    total, written = sum(o.nbytes for plan in plans for o in plan), 0

    def advance(nbytes: int) -> None:
        nonlocal written
        written += nbytes
        progress(written, total)

    ranks = []
    for r, plan in enumerate(plans):
        path = out / f"rank{r}.safetensors"
        size = _write_rank(path, plan, source, chunk_bytes, advance if progress else None)
        ranks.append({"rank": r, "file": path.name, "tensors": len(plan), "bytes": size})

    # ModelOpt writes this for unquantized exports too; TRT-LLM reads it only for MIXED_PRECISION.
    _write_json(out / "quant_cfg.json", {"quant_algo": quant_algo, "kv_cache_quant_algo": None, "quantized_layers": {}})
    _write_json(out / "config.json", build_trtllm_config(layout, tp, pp, dtype, quant_algo))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "tp": tp, "pp": pp, "dtype": dtype, "architecture": layout.architecture, "quant_algo": quant_algo,
        "ranks": ranks,
        "tensors_per_rank": [r["tensors"] for r in ranks],
        "bytes": sum(r["bytes"] for r in ranks),
        "seconds": round(time.monotonic() - started, 3),
        "peak_rss_bytes": peak,
        "rss_start_bytes": rss_start,
    }


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")
    os.replace(partial, path)
