"""The stage graph of a plan: one node per artifact (the source, each checkpoint, each engine), with
the parameters each stage's key holds and where every value came from (for `explain`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pydantic import BaseModel

from trtbuild import hardware, toolchain, trtllm
from trtbuild.validate import gates
from trtbuild.plan import CHECKPOINT, ENGINE, HF_CHECKPOINT, Plan
from trtbuild.stages.base import Stage
from trtbuild.stages.registry import NOT_YET, STAGES

SOURCE = "source"
# `--until STAGE` keeps the nodes at or before STAGE. Checkpoints are validated before any engine.
STAGE_ORDER = {"source": 0, "calibration": 1, "quantize": 1, "checkpoint": 1, "hf-checkpoint": 1,
               "reference": 2, "validate": 2, "engine": 3}


@dataclass(frozen=True)
class Param:
    value: Any
    origin: str  # "recipe: variants.fp8.quant", "default: limits.max_batch_size", "model config", ...


@dataclass
class Node:
    id: str  # the target name (or "source"): unique in a graph, names the ref
    kind: str  # source | checkpoint | hf-checkpoint | engine | ...
    stage: Optional[Stage]
    inputs: dict[str, str] = field(default_factory=dict)  # role -> node id
    params: dict[str, Param] = field(default_factory=dict)
    platform: dict[str, Param] = field(default_factory=dict)  # keyed like params: the SM, the device
    runtime: dict[str, Any] = field(default_factory=dict)  # never in the key
    impossible: Optional[str] = None  # from the plan
    unavailable: Optional[str] = None  # no stage for this kind yet
    requires: Optional[Callable[[], Optional[str]]] = None  # why this host cannot build it
    after: list[str] = field(default_factory=list)  # nodes that must succeed first, not part of the key
    resolve: Optional[Callable[[], dict[str, str]]] = None  # key inputs read at key time (a text's digest)
    serves: Optional[str] = None  # the target this node exists for (its validations, an engine's twin)

    def param_values(self) -> dict[str, Any]:
        return {k: p.value for k, p in self.params.items()}


@dataclass
class Graph:
    recipe: str
    nodes: list[Node]  # topological order

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def dependents(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes if node_id in n.inputs.values()]

    def closure(self, ids: set[str]) -> "Graph":
        """The nodes named and everything they depend on, in order."""
        keep = set(ids)
        for node in reversed(self.nodes):
            if node.id in keep:
                keep |= set(node.inputs.values()) | set(node.after)
        return Graph(self.recipe, [n for n in self.nodes if n.id in keep])


def evaluation_text_digest(spec: str, base_dir) -> str:
    from trtbuild.validate.evaltext import eval_text_digest

    return eval_text_digest(spec, base_dir)


def calibration_text_digest(spec: str, base_dir) -> str:
    from trtbuild.checkpoint.calibration import text_digest

    return text_digest(spec, base_dir)


def quantize_host_problem(quant: Optional[str], kv_cache: Optional[str], device: str) -> Optional[str]:
    """Why this host cannot calibrate: a CUDA device asked for and absent, or a format that ModelOpt
    calibrates only on CUDA (quantize.needs_cuda) with no GPU here."""
    resolved = hardware.resolve_device(device)
    if device == "cuda" and resolved != "cuda":
        return "needs a CUDA GPU (calibration.device: cuda); this machine has none"
    if resolved == "cpu":
        from trtbuild.checkpoint.quantize import needs_cuda

        reason = needs_cuda(quant, kv_cache)
        return f"needs a CUDA GPU: {reason}" if reason else None
    return None


def _trtllm_host_problem(backend: str, series: str) -> Optional[str]:
    from trtbuild.validate import trtllm_runner

    return trtllm_runner.available(backend, series)


def field_param(model: BaseModel, name: str, path: str, value: Any = None) -> Param:
    """A recipe field with its origin: set in the recipe, or the schema's default."""
    origin = "recipe" if name in model.model_fields_set else "default"
    return Param(getattr(model, name) if value is None else value, f"{origin}: {path}")


def build_graph(plan: Plan, registry: Optional[dict[str, Optional[Stage]]] = None, validate: bool = True) -> Graph:
    registry = STAGES if registry is None else registry
    recipe, loaded = plan.recipe, plan.loaded
    source = recipe.source

    def stage_for(kind: str) -> tuple[Optional[Stage], Optional[str]]:
        stage = registry.get(kind)
        label = kind.replace(":", " ")
        return stage, None if stage else NOT_YET.format(kind=label)

    # a .nemo object named by `s3:` is a NeMo source like any other
    kind = "nemo" if source.kind == "s3" and source.location.rstrip("/").endswith(".nemo") else source.kind
    stage, missing = stage_for(f"source:{kind}")
    src = Node(SOURCE, "source", stage, unavailable=missing)
    src.params["kind"] = Param(kind, f"recipe: source.{source.kind}")
    if source.kind == "gguf":
        src.params["dtype"] = Param(plan.dtype, "recipe: dtype" if recipe.dtype else "model config (or float16)")
    src.runtime = {"kind": kind, "location": source.location, "base_dir": str(loaded.base_dir),
                   "trust_remote_code": source.trust_remote_code}
    if source.kind == "hf":
        src.runtime["revision"] = source.revision or "main"
    if source.kind == "path":
        src.runtime["folder"] = str(loaded.resolve_path(source.path))
    nodes = [src]

    calibrations: dict[tuple, str] = {}  # calibration settings -> node id (shared by variants)
    quantized: dict[str, str] = {}  # variant -> node id of its quantized model
    calibration_of: dict[str, str] = {}  # quantized node id -> its calibration node id

    def dtype_param() -> Param:
        return Param(plan.dtype, "recipe: dtype" if recipe.dtype else "model config (or float16)")

    def variant_params(node: Node, vname: str) -> None:
        variant, vpath = recipe.variants[vname], f"variants.{vname}"
        node.params["quant"] = field_param(variant, "quant", f"{vpath}.quant")
        node.params["kv_cache"] = field_param(variant, "kv_cache", f"{vpath}.kv_cache")
        if variant.effective_group_size:
            node.params["group_size"] = field_param(variant, "group_size", f"{vpath}.group_size", variant.effective_group_size)

    def calibration_node(vname: str) -> str:
        """Tokenized calibration windows: keyed by the text's content, not its path."""
        variant, vpath = recipe.variants[vname], f"variants.{vname}"
        settings = recipe.calibration_for(vname)
        signature = (settings.text, settings.samples, settings.seq_len, settings.seed)
        if signature in calibrations:
            return calibrations[signature]
        node_id = "calibration" if not calibrations else f"calibration-{vname}"
        stage, missing = stage_for("calibration")
        node = Node(node_id, "calibration", stage, inputs={"source": SOURCE}, unavailable=missing)
        for name in ("samples", "seq_len", "seed"):
            overridden = variant.calibration is not None and name in variant.calibration.model_fields_set
            origin = (f"recipe: {vpath}.calibration.{name}" if overridden
                      else field_param(recipe.calibration, name, f"calibration.{name}").origin)
            node.params[name] = Param(getattr(settings, name), origin)
        node.runtime = {"text": settings.text, "base_dir": str(loaded.base_dir)}
        node.resolve = lambda spec=settings.text: {"text": calibration_text_digest(spec, loaded.base_dir)}
        calibrations[signature] = node_id
        nodes.append(node)
        return node_id

    def quantized_node(vname: str) -> str:
        """The variant's calibrated, quantized model (its ModelOpt state): computed once, exported
        to every parallelism and to the Hugging Face form."""
        if vname in quantized:
            return quantized[vname]
        variant = recipe.variants[vname]
        calibration = calibration_node(vname)
        stage, missing = stage_for("quantize")
        node = Node(f"{vname}-quantized", "quantize", stage, inputs={"source": SOURCE, "calibration": calibration},
                    unavailable=missing)
        node.params["dtype"] = dtype_param()
        variant_params(node, vname)
        device = recipe.calibration_for(vname).device
        overridden = variant.calibration is not None and "device" in variant.calibration.model_fields_set
        node.platform["device"] = (Param(device, f"recipe: variants.{vname}.calibration.device") if overridden
                                   else field_param(recipe.calibration, "device", "calibration.device"))
        node.runtime["device"] = device
        node.requires = (lambda q=variant.quant, kv=variant.kv_cache, d=device: quantize_host_problem(q, kv, d))
        quantized[vname] = node.id
        calibration_of[node.id] = calibration
        nodes.append(node)
        return node.id

    validations: dict[str, str] = {}  # target -> its validate node

    def reference_node() -> str:
        """Teacher-forced top-k log-probabilities of the source on the evaluation set: once per
        source and evaluation settings, shared by every variant."""
        if any(n.id == "reference" for n in nodes):
            return "reference"
        settings = recipe.validation
        stage, missing = stage_for("reference")
        node = Node("reference", "reference", stage, inputs={"source": SOURCE}, unavailable=missing)
        for name in ("samples", "seq_len"):
            node.params[name] = field_param(settings, name, f"validate.{name}")
        node.params["seed"] = Param(0, "fixed: evaluation windows do not move")
        node.params["dtype"] = dtype_param()  # the candidates' dtype: only quantization may differ
        node.params["top_k"] = Param(gates.TOP_K, "trtbuild: top-k log-probabilities stored per position")
        node.platform["device"] = field_param(settings, "device", "validate.device")
        node.runtime = {"text": settings.text, "base_dir": str(loaded.base_dir), "device": settings.device}
        node.resolve = lambda spec=settings.text: {"text": evaluation_text_digest(spec, loaded.base_dir)}
        nodes.append(node)
        return node.id

    def validate_node(target: str, kind: str, vname: str, target_inputs: dict[str, str]) -> str:
        """The target's accuracy against the reference. A quantized variant is validated through its
        restored ModelOpt model (the same for every parallelism: one key, computed once); an
        unquantized checkpoint through its own files read back."""
        inputs = {"reference": reference_node(), "source": SOURCE}
        if "quantized" in target_inputs:
            inputs["quantized"] = target_inputs["quantized"]
            inputs["calibration"] = calibration_of[target_inputs["quantized"]]
        else:
            inputs["checkpoint" if kind == CHECKPOINT else "hf_checkpoint"] = target
        stage, missing = stage_for("validate")
        node = Node(f"{target}:validate", "validate", stage, inputs=inputs, unavailable=missing, after=[target],
                    serves=target)
        node.params["dtype"] = dtype_param()
        node.params["gates"] = gates_param(vname)
        node.params["runner"] = Param("torch", "trtbuild: checkpoints are validated on torch before any engine")
        node.platform["device"] = field_param(recipe.validation, "device", "validate.device")
        node.runtime = {"device": recipe.validation.device, "target": target}
        nodes.append(node)
        return node.id

    def gates_param(vname: str) -> Param:
        variant = recipe.variants[vname]
        limits = gates.default_gates(variant.quant, variant.kv_cache)
        set_gates = recipe.validation.gates.model_dump(exclude_none=True)
        limits.update(set_gates)
        return Param(limits, "recipe: validate.gates" if set_gates else
                     f"default gates for {gates.FAMILY[variant.quant]} quantization")

    def engine_node(target, gather: bool, suffix: str = "") -> Node:
        """An engine target, or (suffix ":twin") the copy built only to be validated: the same
        flags plus --gather_context_logits, which TensorRT-LLM needs to return prompt logits."""
        stage, missing = stage_for(ENGINE)
        node = Node(target.name + suffix, ENGINE, stage, inputs={"checkpoint": target.depends_on[0]},
                    impossible=target.reason, unavailable=missing, serves=target.name if suffix else None)
        limits = recipe.limits
        for name in ("max_batch_size", "max_input_len", "max_num_tokens", "max_beam_width"):
            node.params[name] = field_param(limits, name, f"limits.{name}")
        node.params["max_seq_len"] = Param(plan.max_seq_len, "recipe: limits.max_seq_len" if limits.max_seq_len
                                           else "model config (max_position_embeddings x rope factor)")
        flags = trtllm.canonical_flags(recipe.engine.flags)
        origin = "recipe: engine.flags" if recipe.engine.flags else "default: engine.flags"
        if gather and not flags.get("gather_context_logits"):
            flags["gather_context_logits"] = True
            origin += f" + gather_context_logits (validate.engines: {recipe.validation.engines})"
        node.params["flags"] = Param(flags, origin)
        node.platform["sm"] = Param(target.gpu, "target: the engine's GPU architecture")
        node.requires = (lambda sm=target.gpu, v=recipe.toolchain.tensorrt_llm: toolchain.engine_host_problem(sm, v))
        return node

    def trtllm_validate_node(target: str, vname: str, backend: str, candidate: str, platform: dict) -> str:
        """The candidate as TensorRT-LLM serves it (an engine, or an hf-checkpoint on the PyTorch
        backend), against the same reference and gates as its checkpoint."""
        stage, missing = stage_for("validate:trtllm")
        node_id = f"{target}:validate" if backend == "engine" else f"{target}:validate-trtllm"
        role = "engine" if backend == "engine" else "hf_checkpoint"
        inputs = {"reference": reference_node(), role: candidate}
        if vname in quantized:  # to say when evaluation and calibration windows overlap
            inputs["calibration"] = calibration_of[quantized[vname]]
        node = Node(node_id, "validate", stage, inputs=inputs, unavailable=missing,
                    after=[] if backend == "engine" else [f"{target}:validate"], serves=target)
        node.params["gates"] = gates_param(vname)
        node.params["runner"] = Param("tensorrt_llm", f"trtbuild: {'engines' if backend == 'engine' else 'hf-checkpoints'} "
                                      "are validated as TensorRT-LLM runs them")
        node.params["backend"] = Param(backend, "trtbuild: the TensorRT backend for engines, PyTorch for hf-checkpoints")
        node.platform.update(platform)
        node.runtime = {"target": target}
        series = ".".join(recipe.toolchain.tensorrt_llm.split(".")[:2])  # engines: the recipe's pinned line
        node.requires = lambda b=backend, s=series: _trtllm_host_problem(b, s)
        nodes.append(node)
        return node.id

    for target in plan.targets:
        variant = recipe.variants[target.variant]
        if target.kind in (CHECKPOINT, HF_CHECKPOINT):
            inputs = {"source": SOURCE}
            if variant.needs_calibration and target.ok:
                inputs["quantized"] = quantized_node(target.variant)
            mode = "export" if variant.needs_calibration else "convert"
            stage, missing = stage_for(f"{target.kind}:{mode}")
            node = Node(target.name, target.kind, stage, inputs=inputs, impossible=target.reason, unavailable=missing)
            node.params["dtype"] = dtype_param()
            variant_params(node, target.variant)
            if target.kind == CHECKPOINT:
                node.params["tp"] = Param(target.tp, "recipe: parallelism")
                node.params["pp"] = Param(target.pp, "recipe: parallelism")
            nodes.append(node)
            if validate and target.ok:
                validations[target.name] = validate_node(target.name, target.kind, target.variant, inputs)
                if target.kind == HF_CHECKPOINT:
                    trtllm_validate_node(target.name, target.variant, "hf", target.name, {})
        elif target.kind == ENGINE:
            mode = recipe.validation.engines if validate and target.ok else "none"
            checkpoint_validation = validations.get(target.depends_on[0])
            node = engine_node(target, gather=mode == "published")
            if checkpoint_validation:  # no GPU time for a checkpoint that failed its gates
                node.after = [checkpoint_validation]
            if mode == "twin":  # the twin is built and validated first; the published engine after it passes
                twin = engine_node(target, gather=True, suffix=":twin")
                twin.after = list(node.after)
                nodes.append(twin)
                node.after.append(trtllm_validate_node(target.name, target.variant, "engine", twin.id, twin.platform))
            nodes.append(node)
            if mode == "published":
                trtllm_validate_node(target.name, target.variant, "engine", node.id, node.platform)
    return Graph(recipe.name, nodes)
