"""Megatron (mcore and legacy) weight names and layouts -> Hugging Face LLaMA tensors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch

from trtbuild.errors import InvalidInput
from trtbuild.nemo.config import NemoConfig
from trtbuild.nemo.tensors import TensorSource

# Canonical (prefix-free) names -> role. nemo.md section 2 tables: mcore first, then legacy.
_LAYER_ROLES = {
    # mcore, TE spec (and every dist checkpoint: sharded_state_dict_keys_map renames local norms)
    "self_attention.linear_qkv.layer_norm_weight": "norm1",
    "self_attention.linear_qkv.weight": "qkv",
    "self_attention.linear_qkv.bias": "qkv_bias",
    "self_attention.linear_proj.weight": "o",
    "self_attention.linear_proj.bias": "o_bias",
    "mlp.linear_fc1.layer_norm_weight": "norm2",
    "mlp.linear_fc1.weight": "fc1",
    "mlp.linear_fc1.bias": "fc1_bias",
    "mlp.linear_fc2.weight": "down",
    "mlp.linear_fc2.bias": "down_bias",
    # mcore, local spec (non-dist only)
    "input_layernorm.weight": "norm1",
    "pre_mlp_layernorm.weight": "norm2",
    # legacy model.language_model.encoder.* (post_attention_layernorm is the pre-MLP norm there)
    "self_attention.query_key_value.weight": "qkv",
    "self_attention.query_key_value.bias": "qkv_bias",
    "self_attention.dense.weight": "o",
    "self_attention.dense.bias": "o_bias",
    "post_attention_layernorm.weight": "norm2",
    "mlp.dense_h_to_4h.weight": "fc1",
    "mlp.dense_h_to_4h.bias": "fc1_bias",
    "mlp.dense_h_to_4h_2.weight": "up2",
    "mlp.dense_h_to_4h_2.bias": "up2_bias",
    "mlp.dense_4h_to_h.weight": "down",
    "mlp.dense_4h_to_h.bias": "down_bias",
}
_GLOBAL_ROLES = {
    "embedding.word_embeddings.weight": "embed",
    "decoder.final_layernorm.weight": "final_norm",
    "output_layer.weight": "lm_head",
    "language_model.embedding.word_embeddings.weight": "embed",
    "language_model.encoder.final_layernorm.weight": "final_norm",
    "language_model.output_layer.weight": "lm_head",
}
_IGNORED = re.compile(r"(^|\.)rotary_pos_emb\.inv_freq$")  # recomputed at run time, not a weight
_LAYER = re.compile(r"^(?:decoder|language_model\.encoder)\.layers\.(\d+)\.(.+)$")
_PREFIXES = ("model.module.", "model.", "module.", "")


def check_supported(cfg: NemoConfig) -> None:
    """Refuse, in one line naming the setting, models a LlamaForCausalLM folder cannot express."""
    where = cfg.source

    def no(what: str) -> None:
        raise InvalidInput(f"{where}: unsupported model for a LLaMA-layout export: {what}")

    if cfg.num_moe_experts:
        no(f"num_moe_experts: {cfg.num_moe_experts} (mixture of experts)")
    if not cfg.gated:
        no(f"activation {cfg.activation!r} is not a gated linear unit (LLaMA needs a gated MLP)")
    if cfg.hidden_act is None:
        no(f"activation {cfg.activation!r} has no Hugging Face equivalent")
    if cfg.position_embedding_type != "rope":
        no(f"position_embedding_type: {cfg.position_embedding_type} (LLaMA uses rope)")
    if cfg.normalization != "rmsnorm":
        name = "layernorm1p" if cfg.zero_centered_gamma and cfg.nemo_version == 1 else cfg.normalization
        no(f"normalization: {name} (LayerNorm with bias; LlamaForCausalLM has RMSNorm only)")
    if cfg.rotary_percent != 1.0:
        no(f"rotary_percent: {cfg.rotary_percent} (partial rotary; LLaMA rotates the whole head)")
    if cfg.rotary_interleaved:
        no("rotary_interleaved: true (HF LLaMA uses the rotate-half convention)")
    if cfg.seq_len_interpolation_factor and cfg.llama3_scaling:
        no("both seq_len_interpolation_factor and Llama-3.1 rope scaling")
    if cfg.unsupported:
        no(cfg.unsupported[0])
    if cfg.num_attention_heads % cfg.num_query_groups:
        raise InvalidInput(f"{where}: num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                           f"num_query_groups {cfg.num_query_groups}")


@dataclass
class Output:
    """One HF tensor to write: its shape and dtype are known before `make` loads anything."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


@dataclass
class Plan:
    outputs: list[Output]
    key_style: str           # "mcore" or "legacy"
    prefix: str
    padded_vocab: int
    vocab_size: int
    attention_bias: bool
    mlp_bias: bool
    has_lm_head: bool


def _prefix(names: list[str]) -> str:
    for p in _PREFIXES:
        if any(n.startswith(p) and n[len(p):] in _GLOBAL_ROLES for n in names) or \
                any(n.startswith(p) and _LAYER.match(n[len(p):]) for n in names):
            return p
    return ""


class _Memo:
    """Keeps the pieces of split tensors (q/k/v, gate/up) until each piece is written once,
    so every stored tensor is read once whatever order the outputs are written in."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[str, torch.Tensor]] = {}

    def take(self, key: str, part: str, compute: Callable[[], dict[str, torch.Tensor]]) -> torch.Tensor:
        if key not in self.parts:
            self.parts[key] = compute()
        pieces = self.parts[key]
        value = pieces.pop(part)
        if not pieces:
            del self.parts[key]
        return value


def build_plan(cfg: NemoConfig, src: TensorSource, vocab_size: int | None) -> Plan:
    """Match every stored name to a role, check shapes against the config, and list the HF outputs."""
    names = src.names()
    prefix = _prefix(names)
    where = src.origin
    glob: dict[str, str] = {}
    layers: dict[int, dict[str, str]] = {}
    for name in names:
        if not name.startswith(prefix):
            raise InvalidInput(f"{where}: unknown key '{name}' (expected prefix '{prefix}')")
        canon = name[len(prefix):]
        if _IGNORED.search(canon):
            continue
        if canon in _GLOBAL_ROLES:
            glob[_GLOBAL_ROLES[canon]] = name
            continue
        m = _LAYER.match(canon)
        role = _LAYER_ROLES.get(m[2]) if m else None
        if role is None:
            raise InvalidInput(f"{where}: unknown key '{name}' (not a Megatron GPT/Llama dense layout)")
        layers.setdefault(int(m[1]), {})[role] = name
    legacy = any(n[len(prefix):].startswith("language_model.") for n in names)
    if legacy and cfg.num_query_groups != cfg.num_attention_heads:
        raise InvalidInput(f"{where}: legacy language_model.* keys with num_query_groups {cfg.num_query_groups} "
                           f"!= heads {cfg.num_attention_heads} (legacy NeMo GPT is MHA only)")
    if sorted(layers) != list(range(cfg.num_layers)):
        raise InvalidInput(f"{where}: found {len(layers)} layers, {cfg.source} says num_layers {cfg.num_layers}")
    if "embed" not in glob:
        raise InvalidInput(f"{where}: no word embeddings key (embedding.word_embeddings.weight)")
    if "final_norm" not in glob:
        raise InvalidInput(f"{where}: no final layernorm key (decoder.final_layernorm.weight)")
    if not cfg.tied and "lm_head" not in glob:
        raise InvalidInput(f"{where}: no output_layer.weight but {cfg.source} says "
                           "share_embeddings_and_output_weights: false")

    H, nh, ng, d, ffn = cfg.hidden_size, cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels, \
        cfg.ffn_hidden_size
    hpg = nh // ng

    def expect(name: str, shape: tuple[int, ...]) -> None:
        if tuple(src.shape(name)) != shape:
            raise InvalidInput(f"{where}: '{name}' has shape {list(src.shape(name))}, "
                               f"expected {list(shape)} from {cfg.source}")

    embed = glob["embed"]
    padded = src.shape(embed)[0]
    expect(embed, (padded, H))
    vocab = vocab_size or padded
    if vocab > padded:
        raise InvalidInput(f"{where}: tokenizer has {vocab} tokens but the embedding only {padded} rows")
    if "lm_head" in glob and not cfg.tied:
        expect(glob["lm_head"], (padded, H))

    attention_bias = any(r in lay for lay in layers.values() for r in ("qkv_bias", "o_bias"))
    mlp_bias = any(r in lay for lay in layers.values() for r in ("fc1_bias", "up2_bias", "down_bias"))
    memo = _Memo()
    outs: list[Output] = []

    def add(hf: str, shape: tuple[int, ...], dtype: torch.dtype, make: Callable[[], torch.Tensor]) -> None:
        outs.append(Output(hf, shape, dtype, make))

    def norm(name: str) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:
            w = src.get(name)
            if cfg.zero_centered_gamma:  # stored gamma - 1 (nemo.md section 1, layernorm1p): add 1 in fp32
                return (w.float() + 1.0).to(w.dtype)
            return w
        return make

    def rows(name: str, n: int) -> Callable[[], torch.Tensor]:
        return lambda: src.get(name)[:n].contiguous()  # trim vocab padding (nemo.md section 1)

    def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Callable[[], torch.Tensor]:
        return lambda: torch.zeros(shape, dtype=dtype)

    def split_qkv(name: str, bias: bool) -> dict[str, torch.Tensor]:
        # nemo.md section 2: per query group hpg q heads, then one k head, then one v head.
        w = src.get(name)
        tail = () if bias else (H,)
        g = w.reshape(ng, hpg + 2, d, *tail)
        return {"q": g[:, :hpg].reshape(nh * d, *tail).contiguous(),
                "k": g[:, hpg].reshape(ng * d, *tail).contiguous(),
                "v": g[:, hpg + 1].reshape(ng * d, *tail).contiguous()}

    def split_fc1(name: str) -> dict[str, torch.Tensor]:
        gate, up = src.get(name).chunk(2, dim=0)  # gate first (TransformFns.merge_fc1, mcore glu)
        return {"gate": gate.contiguous(), "up": up.contiguous()}

    dt = src.dtype
    add("model.embed_tokens.weight", (vocab, H), dt(embed), rows(embed, vocab))
    for i in range(cfg.num_layers):
        lay = layers[i]
        p = f"model.layers.{i}."
        for role in ("norm1", "qkv", "o", "norm2", "fc1", "down"):
            if role not in lay:
                raise InvalidInput(f"{where}: layer {i} has no {role} weight")
        add(p + "input_layernorm.weight", (H,), dt(lay["norm1"]), norm(lay["norm1"]))
        expect(lay["norm1"], (H,))
        qkv = lay["qkv"]
        expect(qkv, ((nh + 2 * ng) * d, H))
        wdt = dt(qkv)
        for part, n in (("q", nh * d), ("k", ng * d), ("v", ng * d)):
            add(p + f"self_attn.{part}_proj.weight", (n, H), wdt,
                lambda qkv=qkv, part=part: memo.take(qkv, part, lambda: split_qkv(qkv, False)))
        if attention_bias:
            if "qkv_bias" in lay:
                qb = lay["qkv_bias"]
                expect(qb, ((nh + 2 * ng) * d,))
                for part, n in (("q", nh * d), ("k", ng * d), ("v", ng * d)):
                    add(p + f"self_attn.{part}_proj.bias", (n,), dt(qb),
                        lambda qb=qb, part=part: memo.take(qb, part, lambda: split_qkv(qb, True)))
            else:  # HF attention_bias covers q, k, v and o together: absent ones are exact zeros
                for part, n in (("q", nh * d), ("k", ng * d), ("v", ng * d)):
                    add(p + f"self_attn.{part}_proj.bias", (n,), wdt, zeros((n,), wdt))
        expect(lay["o"], (H, nh * d))
        add(p + "self_attn.o_proj.weight", (H, nh * d), dt(lay["o"]), lambda n=lay["o"]: src.get(n))
        if attention_bias:
            ob = lay.get("o_bias")
            add(p + "self_attn.o_proj.bias", (H,), dt(ob) if ob else wdt,
                (lambda n=ob: src.get(n)) if ob else zeros((H,), wdt))
        add(p + "post_attention_layernorm.weight", (H,), dt(lay["norm2"]), norm(lay["norm2"]))
        expect(lay["norm2"], (H,))
        fc1 = lay["fc1"]
        if "up2" in lay:  # legacy non-fast GLU: dense_h_to_4h is the gate, dense_h_to_4h_2 the up
            expect(fc1, (ffn, H))
            expect(lay["up2"], (ffn, H))
            add(p + "mlp.gate_proj.weight", (ffn, H), dt(fc1), lambda n=fc1: src.get(n))
            add(p + "mlp.up_proj.weight", (ffn, H), dt(lay["up2"]), lambda n=lay["up2"]: src.get(n))
        else:
            expect(fc1, (2 * ffn, H))
            for part in ("gate", "up"):
                add(p + f"mlp.{part}_proj.weight", (ffn, H), dt(fc1),
                    lambda fc1=fc1, part=part: memo.take(fc1, part, lambda: split_fc1(fc1)))
        if mlp_bias:
            fb = lay.get("fc1_bias")
            if "up2" in lay:
                ub = lay.get("up2_bias")
                for part, bias in (("gate", fb), ("up", ub)):
                    add(p + f"mlp.{part}_proj.bias", (ffn,), dt(fc1),
                        (lambda n=bias: src.get(n)) if bias else zeros((ffn,), dt(fc1)))
            elif fb:
                expect(fb, (2 * ffn,))
                for part in ("gate", "up"):
                    add(p + f"mlp.{part}_proj.bias", (ffn,), dt(fb),
                        lambda fb=fb, part=part: memo.take(fb, part, lambda: split_fc1(fb)))
            else:
                for part in ("gate", "up"):
                    add(p + f"mlp.{part}_proj.bias", (ffn,), dt(fc1), zeros((ffn,), dt(fc1)))
        expect(lay["down"], (H, ffn))
        add(p + "mlp.down_proj.weight", (H, ffn), dt(lay["down"]), lambda n=lay["down"]: src.get(n))
        if mlp_bias:
            db = lay.get("down_bias")
            add(p + "mlp.down_proj.bias", (H,), dt(lay["down"]),
                (lambda n=db: src.get(n)) if db else zeros((H,), dt(lay["down"])))
    fn = glob["final_norm"]
    expect(fn, (H,))
    add("model.norm.weight", (H,), dt(fn), norm(fn))
    # Tied: HF save_pretrained drops lm_head (nemo.md section 3); a stored copy (PP last stage) is ignored.
    has_head = not cfg.tied
    if has_head:
        add("lm_head.weight", (vocab, H), dt(glob["lm_head"]), rows(glob["lm_head"], vocab))
    # Name order, as safetensors' own writer sorts them: the file matches what save_pretrained writes.
    outs.sort(key=lambda o: o.name)
    return Plan(outs, "legacy" if legacy else "mcore", prefix, padded, vocab, attention_bias, mlp_bias, has_head)
