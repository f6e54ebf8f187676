"""The inverse of trtllm_convert, for validation: rebuild the Hugging Face state dict of a LLaMA-family
model (Llama, Mistral, Qwen2 with its q/k/v biases, Mixtral) from an unquantized TensorRT-LLM
checkpoint (config.json + rank{N}.safetensors), at any tp/pp the converter or ModelOpt writes.

What it undoes (reference/trtllm.md section 2; docs/checkpoints.md):
- TP splits: column-parallel tensors (q/k/v, mlp.fc/gate and their biases, the vocab of the
  embedding and lm_head) are concatenated on dim 0, row-parallel ones (attention.dense,
  mlp.proj) on dim 1; Mixtral's `mlp.fc` [E, 2I/tp, H] is split back into w3 | w1 per rank and
  `mlp.proj` [E, H, I/tp] concatenated on its dim 2.
- PP: rank r holds stage r // tp; its `transformer.layers.{j}` is HF layer stage * L/pp + j.
- KV heads duplicated when tp exceeds them: rank t holds KV head t * kv // tp; the copies on the
  ranks sharing a head must be equal (checked), and one of them is kept.
- Vocab padding (to a multiple of tp) is trimmed; `use_parallel_embedding` with
  `embedding_sharding_dim` 0 (what the converter and ModelOpt write) or 1, or a replicated table.
- Replicated tensors (norms, router, row-parallel biases) must be equal on every TP rank (checked).
- Tied embeddings: lm_head.weight is left out (the HF model ties it), after checking that the
  checkpoint's lm_head equals the embedding table; untied models get their own lm_head.
- dtypes: every tensor comes back in the checkpoint's `dtype` (Mixtral's float32 router included).

One rank file is read at a time; each tensor is copied out of the file's memory map before the
file is closed, so memory holds the rebuilt state dict plus one tensor, never two ranks' maps.
Quantized checkpoints are refused (their weights are not the HF weights; they are validated through
their ModelOpt state instead), except those TensorRT-LLM quantizes itself at load (W8A16, W4A16:
float weights on disk): their weights come back as the engine holds them, each rank's weight-only
linears quantized and dequantized the way TensorRT-LLM 1.2 does it (checkpoint/trtllm_loadtime.py),
before the ranks are joined.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from trtbuild.checkpoint.hf_layout import hf_layout
from trtbuild.checkpoint.trtllm_load_rules import WEIGHT_ONLY_ALGOS
from trtbuild.checkpoint.trtllm_config import read_mapping
from trtbuild.checkpoint.verify import verify_trtllm_checkpoint
from trtbuild.errors import TrtbuildError
from trtbuild.model.config import read_json_object



class _Parts:
    """Pieces of the HF tensors, gathered rank by rank and joined at the end."""

    def __init__(self, tp: int) -> None:
        self.tp = tp
        self.split: dict[str, tuple[int, list]] = {}  # hf name -> (dim, piece per tp rank)
        self.whole: dict[str, object] = {}  # replicated: hf name -> tensor (first rank seen)
        self.kv: dict[str, list] = {}  # hf name of k/v (weight or bias) -> piece per tp rank

    def put(self, name: str, dim: int, t: int, tensor) -> None:
        slot = self.split.setdefault(name, (dim, [None] * self.tp))[1]
        slot[t] = tensor

    def put_whole(self, name: str, tensor, where: str) -> None:
        import torch

        first = self.whole.get(name)
        if first is None:
            self.whole[name] = tensor
        elif not torch.equal(first, tensor):
            raise TrtbuildError(f"{where}: {name} differs between tensor-parallel ranks (it must be replicated)")


def trtllm_to_hf_state(ckpt_dir: Union[Path, str], hf_config: dict) -> dict:
    """The Hugging Face state dict (name -> torch.Tensor) that the unquantized TensorRT-LLM
    checkpoint in `ckpt_dir` was made from; `hf_config` is the model's HF config.json as a dict.
    A checkpoint TensorRT-LLM quantizes at load (W8A16 / W4A16 from float weights) comes back with
    the weights the engine computes with. Raises TrtbuildError for any other quantized checkpoint,
    or one that does not fit `hf_config`."""
    import torch

    from trtbuild.checkpoint.trtllm_loadtime import loadtime_weight

    ckpt_dir = Path(ckpt_dir)
    cfg = read_json_object(ckpt_dir / "config.json")
    quant = cfg.get("quantization") if isinstance(cfg.get("quantization"), dict) else {}
    algo, kv_algo = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    if (algo is not None and algo not in WEIGHT_ONLY_ALGOS) or kv_algo is not None:
        what = f"quant_algo {algo}" if algo is not None else f"kv_cache_quant_algo {kv_algo}"
        raise TrtbuildError(f"{ckpt_dir}: {what}: quantized checkpoints are validated through their ModelOpt state")
    # Names, shapes, dtypes, rank files and the config against the HF config (headers only).
    verify_trtllm_checkpoint(ckpt_dir, hf_config)

    L = hf_layout(hf_config, "HF config.json")
    tp, pp, world = read_mapping(cfg)
    dtype = getattr(torch, cfg["dtype"])
    per_stage = L.num_layers // pp
    hd = L.head_dim
    q_per = L.heads * hd // tp
    kv_per = (L.kv_heads // tp if L.kv_heads >= tp else 1) * hd
    I_per = L.intermediate // tp
    parallel_embedding = bool(cfg.get("use_parallel_embedding", False))
    sharding_dim = int(cfg.get("embedding_sharding_dim", 0) or 0)
    parts = _Parts(tp)

    for rank in range(world):
        t, p = rank % tp, rank // tp
        path = ckpt_dir / f"rank{rank}.safetensors"
        where = path.name
        for name, tensor in _read_rank(path, dtype):
            tensor = loadtime_weight(name, tensor, algo, quant.get("exclude_modules"))
            if name == "transformer.vocab_embedding.weight":
                if parallel_embedding:
                    parts.put("model.embed_tokens.weight", sharding_dim, t, tensor)
                else:
                    parts.put_whole("model.embed_tokens.weight", tensor, where)
            elif name == "lm_head.weight":
                parts.put("lm_head.weight", 0, t, tensor)
            elif name == "transformer.ln_f.weight":
                parts.put_whole("model.norm.weight", tensor, where)
            elif name.startswith("transformer.layers."):
                local, rest = name[len("transformer.layers."):].split(".", 1)
                layer = p * per_stage + int(local)
                _layer_tensor(parts, L, f"model.layers.{layer}.", rest, t, tensor, where,
                              q_per=q_per, kv_per=kv_per, I_per=I_per)
            else:  # verify_trtllm_checkpoint already refused unexpected names
                raise TrtbuildError(f"{where}: {name} unexpected")

    state: dict = dict(parts.whole)
    for name, (dim, pieces) in parts.split.items():
        missing = [t for t, piece in enumerate(pieces) if piece is None]
        if missing:
            raise TrtbuildError(f"{ckpt_dir}: {name}: no piece from tensor-parallel rank(s) "
                                f"{', '.join(map(str, missing))}")
        state[name] = torch.cat(pieces, dim=dim) if len(pieces) > 1 else pieces[0]
        pieces.clear()
    for name, pieces in parts.kv.items():
        state[name] = _join_kv(name, pieces, L.kv_heads, tp, str(ckpt_dir))

    # Vocab padding (to a multiple of tp) off; a tied lm_head must be the embedding table.
    V = L.vocab
    embed = state.get("model.embed_tokens.weight")
    if embed is not None and embed.shape[0] > V:
        state["model.embed_tokens.weight"] = embed[:V].clone()
    head = state.get("lm_head.weight")
    if head is None and cfg.get("share_embedding_table"):
        head = state["model.embed_tokens.weight"]
    if head is not None and head.shape[0] > V:
        head = head[:V].clone()
    if L.tied:
        if head is not None and not torch.equal(head, state["model.embed_tokens.weight"]):
            raise TrtbuildError(f"{ckpt_dir}: tie_word_embeddings is true but lm_head.weight differs from "
                                f"transformer.vocab_embedding.weight")
        state.pop("lm_head.weight", None)
    elif head is None:
        raise TrtbuildError(f"{ckpt_dir}: lm_head.weight missing and tie_word_embeddings is false")
    else:
        state["lm_head.weight"] = head
    return state


def _read_rank(path: Path, dtype):
    """(name, tensor) of one rank file, each copied out of the memory map in `dtype`."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            view = f.get_tensor(name)
            tensor = view.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)
            del view
            yield name, tensor


def _layer_tensor(parts: _Parts, L, s: str, rest: str, t: int, tensor, where: str, *,
                  q_per: int, kv_per: int, I_per: int) -> None:
    attn, mlp = s + "self_attn.", s + "mlp."
    if rest == "input_layernorm.weight":
        parts.put_whole(s + "input_layernorm.weight", tensor, where)
    elif rest == "post_layernorm.weight":
        parts.put_whole(s + "post_attention_layernorm.weight", tensor, where)
    elif rest in ("attention.qkv.weight", "attention.qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = tensor.split([q_per, kv_per, kv_per], dim=0)
        parts.put(f"{attn}q_proj.{kind}", 0, t, q)
        for x, piece in (("k", k), ("v", v)):
            parts.kv.setdefault(f"{attn}{x}_proj.{kind}", [None] * parts.tp)[t] = piece
    elif rest == "attention.dense.weight":
        parts.put(attn + "o_proj.weight", 1, t, tensor)
    elif rest == "attention.dense.bias":
        parts.put_whole(attn + "o_proj.bias", tensor, where)
    elif L.num_experts and rest == "mlp.router.weight":
        parts.put_whole(s + "block_sparse_moe.gate.weight", tensor, where)
    elif L.num_experts and rest == "mlp.fc.weight":  # [E, 2 I/tp, H] = per expert w3_t then w1_t
        moe = s + "block_sparse_moe.experts."
        for e in range(tensor.shape[0]):
            parts.put(f"{moe}{e}.w3.weight", 0, t, tensor[e, :I_per].clone())
            parts.put(f"{moe}{e}.w1.weight", 0, t, tensor[e, I_per:].clone())
    elif L.num_experts and rest == "mlp.proj.weight":  # [E, H, I/tp]
        moe = s + "block_sparse_moe.experts."
        for e in range(tensor.shape[0]):
            parts.put(f"{moe}{e}.w2.weight", 1, t, tensor[e].clone())
    elif not L.num_experts and rest in ("mlp.fc.weight", "mlp.fc.bias"):
        parts.put(mlp + "gate_proj." + rest.rsplit(".", 1)[1], 0, t, tensor)
    elif not L.num_experts and rest in ("mlp.gate.weight", "mlp.gate.bias"):
        parts.put(mlp + "up_proj." + rest.rsplit(".", 1)[1], 0, t, tensor)
    elif not L.num_experts and rest == "mlp.proj.weight":
        parts.put(mlp + "down_proj.weight", 1, t, tensor)
    elif not L.num_experts and rest == "mlp.proj.bias":
        parts.put_whole(mlp + "down_proj.bias", tensor, where)
    else:
        raise TrtbuildError(f"{where}: transformer.layers.*.{rest} unexpected")


def _join_kv(name: str, pieces: list, kv_heads: int, tp: int, where: str):
    """k_proj/v_proj (weight or bias) from the TP ranks' pieces. When tp > KV heads, rank t holds
    head t * kv // tp (hf_layout.kv_rows): the ranks sharing a head must agree."""
    import torch

    missing = [t for t, piece in enumerate(pieces) if piece is None]
    if missing:
        raise TrtbuildError(f"{where}: {name}: no piece from tensor-parallel rank(s) {', '.join(map(str, missing))}")
    if kv_heads >= tp:
        return torch.cat(pieces, dim=0) if tp > 1 else pieces[0]
    heads: list[Optional[object]] = [None] * kv_heads
    for t, piece in enumerate(pieces):
        head = t * kv_heads // tp
        if heads[head] is None:
            heads[head] = piece
        elif not torch.equal(heads[head], piece):
            first = next(r for r in range(tp) if r * kv_heads // tp == head)
            raise TrtbuildError(f"{where}: {name}: KV head {head} is duplicated on tensor-parallel ranks {first} and "
                                f"{t} (tp {tp} > {kv_heads} KV heads) but the copies differ")
    return torch.cat(heads, dim=0)
