"""The tensors each quantized Linear of a ModelOpt 0.47 export must hold (dtype and shape), and the
findings on a checkpoint's tensors as one runtime's rules see them: a tensor missing, of the wrong
dtype or shape, a scale of an excluded module, a quantized or tied lm_head, KV-cache scales; and
the runtime-independent defects among them (with what vLLM 0.33.0 does with each when it loads it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trtbuild.errors import InvalidInput
from trtbuild.facts.quantformats import NVFP4_BLOCK, PER_GROUP_ALGOS
from trtbuild.serving.configs import FLOAT_CODES, MATCHERS, Checkpoint, QuantView, chosen_view, linear_shapes

PER_GROUP = PER_GROUP_ALGOS  # int4 per-group layouts: group_size and pre_quant_scale apply


# ---------------------------------------------------------------------------------------------
# Expected tensors of one linear


@dataclass(frozen=True)
class Expect:
    dtype: Optional[tuple[str, ...]]  # accepted safetensors codes; None: any
    shape: Optional[tuple[int, ...]]  # None: not checked
    required: bool = True


def _fmt(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def expected_linear(algo: Optional[str], out_f: int, in_f: int, group: Optional[int], model_dtype: tuple[str, ...]
                    ) -> dict[str, Expect]:
    """suffix -> Expect for one linear of a ModelOpt 0.47 unified HF export (modelopt.md section 4;
    FP8 and NVFP4 as the vLLM/SGLang schemes read them: the runtime table's sources vllm-0.33-modelopt, sglang-modelopt)."""
    F32 = ("F32",)
    if algo is None:
        return {"weight": Expect(model_dtype, (out_f, in_f))}
    if algo == "FP8":
        return {"weight": Expect(("F8_E4M3",), (out_f, in_f)), "weight_scale": Expect(F32, ()),
                "input_scale": Expect(F32, ())}
    if algo == "NVFP4":
        return {"weight": Expect(("U8",), (out_f, in_f // 2)), "weight_scale": Expect(("F8_E4M3",), (out_f, in_f // 16)),
                "weight_scale_2": Expect(F32, ()), "input_scale": Expect(F32, ())}
    if algo in PER_GROUP:
        out = {"weight": Expect(("U8",), (out_f // 2, in_f)),
               "weight_scale": Expect(F32, (out_f, in_f // group) if group else None),
               # q/k/v and gate/up have theirs folded into the preceding norm by the export
               "pre_quant_scale": Expect(model_dtype, (in_f,), required=False)}
        if algo == "W4A8_AWQ":
            out.update(weight_scale_2=Expect(F32, ()), input_scale=Expect(F32, ()))
        return out
    if algo == "W8A16":
        return {"weight": Expect(("I8",), (out_f, in_f)), "weight_scale": Expect(F32, (out_f,))}
    if algo == "W8A8_SQ_PER_CHANNEL":
        return {"weight": Expect(("I8",), (out_f, in_f)), "weight_scale": Expect(F32, (out_f,)),
                "input_scale": Expect(F32, ()), "pre_quant_scale": Expect(model_dtype, (in_f,), required=False)}
    return {"weight": Expect(None, None)}  # a layout not read here: names only


@dataclass(frozen=True)
class Finding:
    """One problem of the tensors (or of lm_head's config) as one runtime's rules see it."""

    line: str
    defect: bool  # the checkpoint is incomplete or wrong, whatever a loader does with it
    vllm_refuses: bool = True  # vLLM 0.33.0's loader raises on it (else: `vllm_does`, what it does instead)
    vllm_does: Optional[str] = None




def _vllm_missing(module: str, suffix: str, algo: Optional[str], tensors: dict) -> Optional[str]:
    """What vLLM 0.33.0's default load (`vllm serve` as packaged: no model-loader extra config) does
    instead of refusing a missing linear tensor `module.suffix`, or None when it refuses ("Following
    weights were not initialized from checkpoint"). By default it tracks the loaded weights of an
    unquantized model only (model_loader/default_loader.py, DefaultModelLoader.load_weights,
    l.510-518), and there it exempts every module with a quant_method, which the linear layers have
    (track_weights_loading, l.540-565): so a missing linear tensor is never refused."""
    if algo is None:
        return "vLLM 0.33.0 loads the model with it uninitialised: its loaded-weights check exempts an unquantized model's linear layers"
    return ("vLLM 0.33.0 loads the layer with it uninitialised: by default it checks the loaded weights of unquantized "
            "models only")


def tensor_findings(runtime: str, view: Optional[QuantView], group: Optional[int], ck: Checkpoint
                     ) -> list[Finding]:
    algo = view.algo if view is not None and isinstance(view.algo, str) else None
    patterns = view.exclude if view is not None and isinstance(view.exclude, list) else []
    patterns = [p for p in patterns if isinstance(p, str)]
    matches = MATCHERS[runtime]
    tensors = ck.tensors
    embed = tensors.get("model.embed_tokens.weight", {})
    model_dtype = (embed["dtype"],) if embed.get("dtype") in FLOAT_CODES else FLOAT_CODES
    tied = bool(ck.config.get("tie_word_embeddings", False))
    problems: list[Finding] = []
    try:
        shapes = linear_shapes(ck.config, tensors)
    except InvalidInput as exc:
        return [Finding(f"tensors not checked: {exc}", defect=False)]

    for module, (out_f, in_f) in shapes.items():
        excluded = algo is None or any(matches(module, p) for p in patterns)
        module_algo = None if excluded else algo
        if module == "lm_head" and module_algo is not None:
            if tied:
                problems.append(Finding(
                    f"config.json: tie_word_embeddings is true, so lm_head is model.embed_tokens, which is "
                    f"not quantized, but {view.exclude_field} does not exclude lm_head", defect=False))
                continue
            if runtime == "vllm":
                # vLLM 0.33.0 loads it (its default load tracks no weight of a quantized model), with
                # lm_head quantized, which vLLM #45102 says to avoid: a warning, since the other
                # runtimes serve the same checkpoint as it is meant
                problems.append(Finding(
                    f"{view.source}: {view.exclude_field} does not exclude lm_head: vLLM would quantize "
                    f"its ParallelLMHead as {algo} (keep lm_head unquantized: vLLM #45102)", defect=False,
                    vllm_refuses=False))
        if module_algo in PER_GROUP and group and in_f % group:
            problems.append(Finding(f"{view.source}: group_size {group} does not divide {module}'s in_features {in_f}",
                                    defect=False))
            group_for = None
        else:
            group_for = group
        want = expected_linear(module_algo, out_f, in_f, group_for, model_dtype)
        head_optional = module == "lm_head" and tied
        for suffix, exp in want.items():
            name = f"{module}.{suffix}"
            info = tensors.get(name)
            if info is None:
                if exp.required and not head_optional:
                    what = " ".join(x for x in ("/".join(exp.dtype) if exp.dtype else None,
                                                _fmt(exp.shape) if exp.shape is not None else None) if x)
                    does = _vllm_missing(module, suffix, algo, tensors)
                    problems.append(Finding(f"{name} missing (expected {what}"
                                            f"{' for ' + module_algo if module_algo else ''})", defect=True,
                                            vllm_refuses=does is None, vllm_does=does))
                continue
            shape, dtype = tuple(info.get("shape", ())), info.get("dtype")
            if exp.dtype is not None and dtype not in exp.dtype:
                # vLLM's weight loaders copy_ the tensor into the parameter, converting its dtype
                problems.append(Finding(f"{name} dtype expected {'/'.join(exp.dtype)}, found {dtype}", defect=True,
                                        vllm_refuses=False,
                                        vllm_does=f"vLLM 0.33.0's weight loader would convert it to the parameter's dtype"))
            if exp.shape is not None and shape != exp.shape:
                problems.append(Finding(f"{name} shape expected {_fmt(exp.shape)}, found {_fmt(shape)}", defect=True))
        if module_algo is None:
            for suffix in ("weight_scale", "weight_scale_2", "input_scale"):
                if f"{module}.{suffix}" in tensors:
                    why = "excluded from quantization" if algo is not None else "the checkpoint is not quantized"
                    problems.append(Finding(f"{module}.{suffix} present but {module} is {why}: its weight is loaded as "
                                            "unquantized", defect=True))
    kv = view.kv_algo if view is not None else None
    # A quantized KV cache reads per-tensor k/v scales. Every runtime's reasons keep FP8's (its loaders read
    # them); the defects also name an INT8 KV cache's, which vLLM does not quantize (vllm_kv_warning).
    if kv in ("FP8", "INT8") and (kv == "FP8" or runtime == "defects"):
        for i in range(int(ck.config.get("num_hidden_layers", 0))):
            names = {scale: f"model.layers.{i}.self_attn.{proj}.{scale}" for proj, scale in (("k_proj", "k_scale"),
                                                                                           ("v_proj", "v_scale"))}
            absent = [scale for scale, name in names.items() if name not in tensors]
            for scale, name in names.items():
                info = tensors.get(name)
                if info is None:
                    # BaseKVCacheMethod.process_weights_after_loading (vllm v0.33.0 kv_cache.py l.113-140): both
                    # missing: scale 1.0; one missing: `assert layer.k_scale > 0.0` fails
                    both = len(absent) == 2 or kv == "INT8"  # vLLM keeps an INT8-declared KV cache unquantized
                    problems.append(Finding(
                        f"{name} missing (expected F32 [] for the {kv} KV cache)", defect=True,
                        vllm_refuses=not both,
                        vllm_does=f"vLLM 0.33.0 would use a KV scale of 1.0 for layer {i}"
                        if both and kv == "FP8" else None))
                elif info.get("dtype") != "F32" or tuple(info.get("shape", ())) != ():
                    problems.append(Finding(f"{name} expected F32 [], found {info.get('dtype')} "
                                            f"{_fmt(info.get('shape', ()))}", defect=True))
    return problems


def defects(ck: Checkpoint) -> list[str]:
    """The checkpoint's integrity findings, runtime-independent (the config the runtimes that read
    config.json use; its group size as written), each saying what vLLM does with it when it loads it."""
    view = chosen_view("vllm", ck)
    group = view.group_size if view is not None and isinstance(view.group_size, int) and view.group_size > 0 else None
    if view is not None and view.algo == "NVFP4" and group is None:
        group = NVFP4_BLOCK
    return [f.line + (f" ({f.vllm_does})" if not f.vllm_refuses and f.vllm_does else "")
            for f in tensor_findings("defects", view, group, ck) if f.defect]


