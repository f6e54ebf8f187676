"""Expand a recipe into targets and check each against TensorRT-LLM's rules and the GPU's memory.

Everything here is a pure function of the recipe and the model config: no GPU, no weights.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional, Union

from trtbuild.plan import engine_flags
from trtbuild.plan import estimate
from trtbuild.facts import gpus as gpu_facts  # `gpus` is a recipe's list here
from trtbuild.facts import nodeids
from trtbuild.facts import quantformats
from trtbuild.facts import serving
from trtbuild.facts import trtllm
from trtbuild.errors import InvalidInput
from trtbuild.model.config import ModelSpec
from trtbuild.plan.model_config import find_model_config
from trtbuild.recipe.schema import LoadedRecipe, Recipe, Variant

CHECKPOINT, ENGINE, HF_CHECKPOINT, GGUF = "checkpoint", "engine", "hf-checkpoint", "gguf"


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # checkpoint | engine | hf-checkpoint | gguf
    variant: str
    tp: Optional[int]
    pp: Optional[int]
    gpu: Optional[str]  # SM, engines only
    backend: str  # engine | hf-checkpoint | gguf
    status: str = "ok"  # ok | impossible
    reason: Optional[str] = None
    depends_on: tuple[str, ...] = ()
    estimate: Optional[estimate.Estimate] = None
    warnings: tuple[str, ...] = ()
    # hf-checkpoints only: {runtime: SMs of the recipe's GPUs it serves on} and {runtime: {sm: note}}
    # (trtbuild/facts/serving.py's table)
    serves: Optional[dict[str, tuple[str, ...]]] = field(default=None, hash=False)
    serve_notes: Optional[dict[str, dict[str, str]]] = field(default=None, hash=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_json(self) -> dict:
        return {
            "name": self.name, "kind": self.kind, "variant": self.variant, "tp": self.tp, "pp": self.pp,
            "gpu": self.gpu, "backend": self.backend, "status": self.status, "reason": self.reason,
            "depends_on": list(self.depends_on),
            "estimate": self.estimate.as_json() if self.estimate else None,
            "warnings": list(self.warnings),
            "serves": {r: list(sms) for r, sms in self.serves.items()} if self.serves is not None else None,
            "serve_notes": self.serve_notes,
        }

    def serves_line(self) -> Optional[str]:
        """`trtllm>=1.3 sm89 sm90; vllm sm89 sm90` (`none`), with fallback notes; None off hf-checkpoints."""
        if self.serves is None:
            return None
        text = serving.served_text(self.serves)
        notes = []
        for runtime, by_sm in (self.serve_notes or {}).items():
            grouped: dict[str, list[str]] = {}
            for sm, note in by_sm.items():
                grouped.setdefault(note, []).append(sm)
            notes += [f"{serving.served_text({runtime: sms})}: {note}" for note, sms in grouped.items()]
        return text + (f" ({'; '.join(notes)})" if notes else "")


@dataclass
class Plan:
    loaded: LoadedRecipe
    model: ModelSpec
    dtype: str
    max_seq_len: int
    targets: list[Target] = field(default_factory=list)
    config_origin: str = ""  # where the model config came from ("GGUF header of ...", "source.config ...")

    @property
    def recipe(self) -> Recipe:
        return self.loaded.recipe

    def target(self, name: str) -> Target:
        return next(t for t in self.targets if t.name == name)

    def as_json(self) -> dict:
        return {
            "recipe": self.recipe.name,
            "path": str(self.loaded.path),
            "model": {"architecture": self.model.architecture, "config": self.model.source,
                      "config_origin": self.config_origin,
                      "dtype": self.dtype, "max_seq_len": self.max_seq_len,
                      "parameters": estimate.parameter_counts(self.model)},
            "targets": [{**t.as_json(), "build_needs": self.build_needs(t)} for t in self.targets],
        }

    def build_needs(self, target: Target) -> Optional[dict]:
        """What the host that builds an engine target needs, all its ranks building at once."""
        return estimate.build_memory_needs(self, target).as_json() if target.kind == ENGINE else None


# ---- names ---------------------------------------------------------------------------------------

# made by trtbuild/facts/nodeids.py (checkpoint_id, engine_id, hf_id), which also parses them


# ---- expansion and rules -------------------------------------------------------------------------

def parse_gpu(choice: Optional[str]) -> Optional[set]:
    """`--gpu` of plan and build: None for all, else the one gpu_facts.GpuChoice named (an SM, or a
    product whose memory the estimates then use)."""
    if choice is None or choice == "all":
        return None
    try:
        return {gpu_facts.resolve_gpu(choice)}
    except ValueError as exc:
        raise InvalidInput(f"--gpu: {exc}") from None


def plan_recipes(paths: list, gpu: Optional[str] = None) -> list[Plan]:
    """`trtbuild plan`: every recipe validated first (an invalid one means no plan at all: every
    problem of every recipe, one line each), then each planned for `gpu` (parse_gpu)."""
    from trtbuild.recipe.schema import load_recipe

    gpu_filter = parse_gpu(gpu)
    loaded, errors = [], []
    for path in paths:
        try:
            loaded.append(load_recipe(path))
        except InvalidInput as exc:
            errors.extend(exc.messages)
    if errors:
        raise InvalidInput(*errors)
    return [plan_recipe(item, gpu_filter=gpu_filter) for item in loaded]


def plan_recipe(loaded: LoadedRecipe, model: Optional[ModelSpec] = None,
                gpu_filter: Optional[Iterable[Union[str, gpu_facts.GpuChoice]]] = None, state=None) -> Plan:
    """`gpu_filter`: plan only engines for these GPUs, each an SM or a product (a name, or a
    resolved `gpu_facts.GpuChoice`). An SM keeps the cards the recipe names for it; a product is
    the card its SM's engine is estimated on (`--gpu L4` asks about the L4, not the recipe's L40S).
    `state`: a store's stat cache (find_model_config)."""
    recipe = loaded.recipe
    if model is None:
        model, origin = find_model_config(loaded, state)
    else:
        origin = model.source
    dtype = recipe.dtype or model.dtype or "float16"
    max_seq_len = recipe.limits.max_seq_len or model.max_seq_len or 2048  # builder._init_max_seq_len fallback
    plan = Plan(loaded, model, dtype, max_seq_len, config_origin=origin)

    gpus = _gpus_by_sm(recipe)
    if gpu_filter is not None:
        gpus = _filter_gpus(loaded, gpus, gpu_filter)

    targets: list[Target] = []
    for vname, variant in recipe.variants.items():
        if variant.gguf:
            if GGUF in recipe.backends:
                targets.append(_gguf_target(plan, vname, variant))
            continue
        if ENGINE in recipe.backends:
            for par in recipe.parallelism:
                ckpt = _checkpoint_target(plan, vname, variant, par.tp, par.pp)
                targets.append(ckpt)
                for cards in gpus.values():
                    targets.append(_engine_target(plan, ckpt, variant, cards))
        if HF_CHECKPOINT in recipe.backends:
            targets.append(_hf_target(plan, vname, variant))
    plan.targets = _drop_unused(_apply_excludes(recipe, targets))
    return plan


@dataclass(frozen=True)
class SmCards:
    """The cards one SM's engine must fit, and who chose them (Estimate.gpu_chosen_by)."""

    sm: str
    products: tuple[gpu_facts.GpuProduct, ...]
    chosen_by: str  # recipe | default (the recipe named only the SM) | option (--gpu PRODUCT)


def _gpus_by_sm(recipe: Recipe) -> dict[str, SmCards]:
    """One engine per SM; the products named for it (or the SM's default) are the ones it must fit."""
    named: dict[str, list[gpu_facts.GpuProduct]] = {}
    defaults: dict[str, gpu_facts.GpuProduct] = {}
    for choice in recipe.gpu_choices():
        products = named.setdefault(choice.sm, [])
        if choice.named_product and choice.product not in products:
            products.append(choice.product)
        elif not choice.named_product:
            defaults[choice.sm] = choice.product
    return {sm: SmCards(sm, tuple(products), "recipe") if products else SmCards(sm, (defaults[sm],), "default")
            for sm, products in named.items()}


def _filter_gpus(loaded: LoadedRecipe, gpus: dict[str, SmCards],
                 gpu_filter: Iterable[Union[str, gpu_facts.GpuChoice]]) -> dict[str, SmCards]:
    choices = [c if isinstance(c, gpu_facts.GpuChoice) else gpu_facts.resolve_gpu(c) for c in gpu_filter]
    unknown = sorted({c.product.name + f" ({c.sm})" if c.named_product else c.sm for c in choices if c.sm not in gpus})
    if unknown:
        listed = ", ".join(gpus) or "none"
        raise InvalidInput(f"--gpu {', '.join(unknown)}: {loaded.path} targets {listed}")
    kept: dict[str, SmCards] = {}
    for sm, cards in gpus.items():
        wanted = [c for c in choices if c.sm == sm]
        if not wanted:
            continue
        products = tuple(dict.fromkeys(c.product for c in wanted if c.named_product))
        kept[sm] = SmCards(sm, products, "option") if products else cards
    return kept


def _model_rules(model: ModelSpec, variant: Variant, tp: int, pp: int) -> Optional[str]:
    """Rules that make a (variant, tp, pp) checkpoint impossible for this model."""
    if model.num_heads % tp:
        return f"tp={tp} does not divide the {model.num_heads} attention heads"
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        return (f"tp={tp} and {kv} KV heads: TensorRT-LLM needs tp to divide the KV heads, "
                "or the KV heads to divide tp (it then duplicates them)")
    if pp > model.num_layers:
        return f"pp={pp} exceeds the model's {model.num_layers} layers"
    group = variant.effective_group_size
    if group:
        fmt = quantformats.FORMATS[variant.quant]
        dims = {"hidden_size": model.hidden_size,
                f"intermediate_size/tp ({model.intermediate_size}/{tp})": model.intermediate_size / tp,
                f"attention width/tp ({model.num_heads * model.head_dim}/{tp})": model.num_heads * model.head_dim / tp}
        for label, size in dims.items():
            if size % group:
                return f"{'AWQ' if fmt.awq else fmt.label} group_size {group} does not divide {label} = {size:g}"
    for fmt in _formats(variant):
        if fmt.block:
            for label, size in (("hidden_size", model.hidden_size), ("intermediate_size", model.intermediate_size)):
                if size % fmt.block:
                    return f"{fmt.name.upper()} blocks of {fmt.block} do not divide {label} = {size}"
    return None


def _loadtime_rules(model: ModelSpec, variant: Variant, tp: int) -> Optional[str]:
    """TensorRT-LLM quantizes a W8A16 checkpoint's linears at load, rank by rank, into a GEMM layout
    with size rules of its own (trtllm_load_rules.weight_only_dims_problem)."""
    from trtbuild.checkpoint.trtllm_load_rules import weight_only_dims_problem

    algo = quantformats.trtllm_loadtime_algo(variant.quant)
    if algo is None:
        return None
    hidden, attention = model.hidden_size, model.num_heads * model.head_dim
    kv_out = max(model.num_kv_heads // tp, 1) * model.head_dim  # KV heads duplicated when tp exceeds them
    mlp_out = model.intermediate_size // tp
    linears = {"attention.qkv": (attention // tp + 2 * kv_out, hidden), "attention.dense": (hidden, attention // tp),
               "mlp.fc": (mlp_out, hidden), "mlp.proj": (hidden, mlp_out)}
    return weight_only_dims_problem(algo, linears)


def _formats(variant: Variant) -> list:
    """The variant's weight format and KV-cache format, from trtbuild/facts/quantformats.py's table."""
    return ([quantformats.FORMATS[variant.quant]] if variant.quant else []) + (
        [quantformats.KV_FORMATS[variant.kv_cache]] if variant.kv_cache else [])


def _limit_rules(plan: Plan) -> Optional[str]:
    limits, max_seq = plan.recipe.limits, plan.max_seq_len
    if limits.max_input_len > max_seq:
        return f"limits.max_input_len {limits.max_input_len} exceeds max_seq_len {max_seq}"
    positions = plan.model.max_seq_len
    if limits.max_seq_len is not None and positions is not None and limits.max_seq_len > positions:
        return (f"limits.max_seq_len {limits.max_seq_len} exceeds the model's {positions} positions"
                f" ({plan.model.source}: max_position_embeddings with rope scaling)")
    return None


# The families trtbuild's checkpoint stage writes TensorRT-LLM checkpoints for (its streaming converter
# and ModelOpt's export with the llama/qwen decoder types); others are refused at plan time.
CHECKPOINT_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM")


def _checkpoint_target(plan: Plan, vname: str, variant: Variant, tp: int, pp: int) -> Target:
    reason = None
    if plan.model.architecture not in CHECKPOINT_ARCHITECTURES:
        reason = (f"not supported: {plan.model.architecture} (TensorRT-LLM checkpoints are written for "
                  f"{', '.join(CHECKPOINT_ARCHITECTURES)}; the hf-checkpoint backend takes others)")
    reason = (reason or quantformats.trtllm_checkpoint_problem(variant.quant, variant.kv_cache)
              or _model_rules(plan.model, variant, tp, pp)
              or _loadtime_rules(plan.model, variant, tp)
              or quantformats.trtllm_export_dtype_problem(variant.quant, variant.kv_cache, plan.dtype))
    est = estimate.Estimate(
        weights_bytes_per_gpu=estimate.weights_bytes_per_gpu(plan.model, tp, pp, variant.quant, plan.dtype, variant.effective_group_size),
        kv_bytes_per_token=estimate.kv_bytes_per_token(plan.model, tp, pp, variant.kv_cache, plan.dtype),
    )
    return Target(
        name=nodeids.checkpoint_id(vname, tp, pp), kind=CHECKPOINT, variant=vname, tp=tp, pp=pp, gpu=None,
        backend=ENGINE, status="impossible" if reason else "ok", reason=reason, estimate=est,
    )


def _engine_target(plan: Plan, ckpt: Target, variant: Variant, cards: SmCards) -> Target:
    recipe, model, sm = plan.recipe, plan.model, cards.sm
    tp, pp = ckpt.tp or 1, ckpt.pp or 1
    weights = ckpt.estimate.weights_bytes_per_gpu
    kv_per_token = ckpt.estimate.kv_bytes_per_token
    activations = estimate.activation_bytes(
        model, tp, plan.dtype, recipe.limits.max_num_tokens, recipe.limits.max_batch_size, recipe.limits.max_beam_width
    )
    smallest = min(cards.products, key=lambda p: p.memory_mib)  # an engine for an SM must fit every GPU named for it
    fits, kv_tokens = estimate.fit_on_gpu(weights, kv_per_token, activations, smallest.memory_bytes)
    est = estimate.Estimate(weights, kv_per_token, kv_tokens, fits, smallest.name, smallest.memory_bytes, activations,
                            cards.chosen_by)

    reason = None
    if not ckpt.ok:
        reason = f"needs checkpoint {ckpt.name}, which is impossible: {ckpt.reason}"
    elif model.architecture not in trtllm.ENGINE_ARCHITECTURES:
        reason = (f"{model.architecture} is not in TensorRT-LLM {trtllm.ENGINE_TOOLCHAIN_SERIES}'s engine MODEL_MAP; "
                  "build the hf-checkpoint backend instead")
    else:
        fmt = engine_flags.EngineFormat(variant.quant, variant.kv_cache, plan.dtype, sm)
        engine_flags.engine_flags(recipe.engine.flags, fmt)  # every value against the pinned flag table, now
        # validate.engines twin/published builds an engine with --gather_context_logits (graph.engine)
        engines = recipe.validation.engines
        gather = f"validate.engines: {engines}" if engines != "none" else None
        reason = (quantformats.quant_unsupported_reason(variant.quant, variant.kv_cache, sm)
                  or engine_flags.recipe_flag_problem(recipe.engine.flags, fmt, model.architecture, gather)
                  or _limit_rules(plan))
    if reason is None and not fits:
        g = estimate.format_bytes
        reason = (f"does not fit on {smallest.name} ({g(smallest.memory_bytes)}): weights {g(weights)}/GPU + "
                  f"activations {g(activations)} > {estimate.USABLE_FRACTION:.0%} of memory "
                  f"({g(estimate.USABLE_FRACTION * smallest.memory_bytes)})")
    warnings = []
    if reason is None and kv_tokens < plan.max_seq_len:
        warnings.append(f"KV cache holds {kv_tokens:,} tokens per GPU on {smallest.name}: less than one "
                        f"max_seq_len ({plan.max_seq_len:,}) sequence")
    return Target(
        name=nodeids.engine_id(ckpt.variant, tp, pp, sm), kind=ENGINE, variant=ckpt.variant, tp=tp, pp=pp, gpu=sm,
        backend=ENGINE, status="impossible" if reason else "ok", reason=reason, depends_on=(ckpt.name,),
        estimate=est, warnings=tuple(warnings),
    )


def serving_sms_of(recipe: Recipe) -> list[str]:
    """The SMs an hf-checkpoint must be served on: the recipe's `gpus:` (all of them, whatever
    `--gpu` filters: a checkpoint is built once, for every GPU), or every SM when it names none."""
    sms = {c.sm for c in recipe.gpu_choices()} or set(gpu_facts.SM_ARCHES)
    return sorted(sms, key=gpu_facts.sm_number)


def _hf_target(plan: Plan, vname: str, variant: Variant) -> Target:
    reason = _model_rules(plan.model, variant, 1, 1) or _limit_rules(plan)
    if reason is None and variant.kv_cache and not quantformats.KV_FORMATS[variant.kv_cache].hf_export:
        reason = (f"{quantformats.KV_FORMATS[variant.kv_cache].label} has no Hugging Face checkpoint form: ModelOpt 0.47's "
                  "export_hf_checkpoint rejects it (use fp8, or the engine backend)")
    sms = serving_sms_of(plan.recipe)
    serves = {r: tuple(serving.serving_sms(r, variant.quant, variant.kv_cache, sms)) for r in serving.RUNTIMES}
    reason = reason or serving.unservable_reason(variant.quant, variant.kv_cache, sms)
    est = estimate.Estimate(
        weights_bytes_per_gpu=estimate.weights_bytes_per_gpu(
            plan.model, 1, 1, variant.quant, plan.dtype, variant.effective_group_size, hf_layout=True),
        kv_bytes_per_token=estimate.kv_bytes_per_token(plan.model, 1, 1, variant.kv_cache, plan.dtype),
    )
    return Target(
        name=nodeids.hf_id(vname), kind=HF_CHECKPOINT, variant=vname, tp=None, pp=None, gpu=None,
        backend=HF_CHECKPOINT, status="impossible" if reason else "ok", reason=reason, estimate=est,
        serves=serves, serve_notes=serving.serve_notes(variant.quant, variant.kv_cache, sms),
    )


def _gguf_target(plan: Plan, vname: str, variant: Variant) -> Target:
    """llama.cpp's GGUF of the source in the variant's type: possible when llama.cpp's converter maps
    the architecture (facts/llamacpp.py, read from the pinned converter). Its estimate is the file's
    weights and a float16 KV cache of max_seq_len tokens (llama.cpp's default cache type)."""
    from trtbuild.facts import llamacpp

    model, gguf_type = plan.model, quantformats.GGUF_TYPES[variant.gguf]
    reason = None
    if model.architecture not in llamacpp.CONVERTER_ARCHITECTURES:
        reason = (f"not supported: llama.cpp's converter ({llamacpp.PINNED}) has no mapping for {model.architecture} "
                  "(conversion/__init__.py TEXT_MODEL_MAP)")
    reason = reason or _limit_rules(plan)
    warnings = []
    fallback = {rows: quantformats.gguf_weight_type(variant.gguf, rows) for rows in
                sorted({model.hidden_size, model.intermediate_size, model.num_heads * model.head_dim})}
    main = quantformats.GGML_TYPES[gguf_type.weights]
    odd = {rows: t for rows, t in fallback.items() if t is not main}
    if reason is None and odd:
        widths = " and ".join(str(rows) for rows in odd)
        warnings.append(f"{widths}-wide weights stored in {'/'.join(sorted({t.name for t in odd.values()}))}: "
                        f"{main.block} does not divide {widths} (llama.cpp's fallback)")
    est = estimate.Estimate(weights_bytes_per_gpu=estimate.gguf_bytes(model, variant.gguf),
                            kv_bytes_per_token=estimate.kv_bytes_per_token(model, 1, 1, None, "float16"))
    return Target(name=nodeids.gguf_id(vname), kind=GGUF, variant=vname, tp=None, pp=None, gpu=None, backend=GGUF,
                  status="impossible" if reason else "ok", reason=reason, estimate=est, warnings=tuple(warnings))


def _matches(rule, target: Target) -> bool:
    for attr in ("variant", "tp", "pp", "backend"):
        wanted = getattr(rule, attr)
        if wanted is not None and getattr(target, attr) != wanted:
            return False
    if rule.gpu is not None and target.gpu != gpu_facts.resolve_gpu(rule.gpu).sm:
        return False
    return True


def _apply_excludes(recipe: Recipe, targets: list[Target]) -> list[Target]:
    return [t for t in targets if not any(_matches(rule, t) for rule in recipe.exclude)]


def _drop_unused(targets: list[Target]) -> list[Target]:
    """A checkpoint exists for its engines: drop one whose engines were all excluded or filtered out."""
    needed = {dep for t in targets for dep in t.depends_on}
    return [t for t in targets if t.kind != CHECKPOINT or t.name in needed]


def select(plan: Plan, patterns: list[str]) -> Plan:
    """Keep the targets whose names match any glob, plus everything they depend on."""
    if not patterns:
        return plan
    chosen = {t.name for t in plan.targets if any(fnmatch.fnmatchcase(t.name, p) for p in patterns)}
    if not chosen:
        raise InvalidInput(f"--target {' '.join(patterns)}: matches none of {', '.join(t.name for t in plan.targets)}")
    chosen |= {dep for t in plan.targets if t.name in chosen for dep in t.depends_on}
    return replace(plan, targets=[t for t in plan.targets if t.name in chosen])
