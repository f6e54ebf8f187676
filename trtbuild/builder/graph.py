"""The stage graph of a plan: one node per artifact (the source, each checkpoint, each engine), with
the parameters each stage's key holds and where every value came from (for `explain`).

The graph is plain data: nodes hold values. What a node needs of a host (a GPU, tensorrt_llm) is a
small frozen record that checks itself (`HostNeed`), declared beside the stages that need it, like the
texts whose content is a key input (stages/needs.py), and the graph asks the registry for them.
`GraphBuilder` has one method per kind of node. Why a node cannot run is one notion, `CannotRun`,
with a kind and a reason."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel

from trtbuild.plan import engine_flags
from trtbuild.facts import quantformats
from trtbuild.facts import serving
from trtbuild.serving import options as serving_options
from trtbuild.facts.nodeids import GGUF_CONVERTED, hf_export_id, quantized_id, trtllm_validate_id, twin_id, validate_id, vllm_validate_id  # noqa: F401 (graph.X_id for callers)
from trtbuild.plan.expand import CHECKPOINT, ENGINE, GGUF, HF_CHECKPOINT, Plan, Target
from trtbuild.builder.stages.base import BuildNeeds, Stage, StageRuntime
from trtbuild.builder.stages.install import install_hint
from trtbuild.builder.stages.needs import HostNeed, TextInput
from trtbuild.builder.stages.registry import NOT_YET, STAGES, host_need, text_input
from trtbuild.validate import gates

SOURCE = "source"
# `--until STAGE` keeps the nodes at or before STAGE. Checkpoints are validated before any engine.
STAGE_ORDER = {"source": 0, "calibration": 1, "quantize": 1, "checkpoint": 1, "hf-export": 1, "hf-checkpoint": 1,
               "gguf-convert": 1, "gguf": 1, "reference": 2, "validate": 2, "engine": 3}
# llama.cpp's converter writes the source's float weights in the recipe's dtype (its --outtype)
GGUF_OUTTYPE = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


# ---- why a node cannot run ----------------------------------------------------------------------

class Blocker(str, enum.Enum):
    PLAN = "impossible"  # the plan rules the target out: status impossible
    NO_STAGE = "no-stage"  # this version of trtbuild has no stage for the node: skipped
    HOST = "host"  # this host lacks the hardware or runtime (a GPU, tensorrt_llm): skipped, or failed with --require-all
    INSTALL = "install"  # this install lacks the stage's Python packages: failed (the install must change)


@dataclass(frozen=True)
class CannotRun:
    kind: Blocker
    reason: str


# ---- the graph ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    value: Any
    origin: str  # "recipe: variants.fp8.quant", "default: limits.max_batch_size", "model config", ...
    parts: Optional[dict[str, str]] = None  # a dict value's per-entry origins (an engine's flags)


@dataclass
class Node:
    id: str  # the target name (or "source"): unique in a graph, names the ref
    kind: str  # source | calibration | quantize | checkpoint | hf-export | hf-checkpoint | gguf-convert | gguf | reference | validate | engine
    stage: Optional[Stage]
    inputs: dict[str, str] = field(default_factory=dict)  # role -> node id
    params: dict[str, Param] = field(default_factory=dict)
    platform: dict[str, Param] = field(default_factory=dict)  # keyed like params: the SM, the device
    runtime: StageRuntime = field(default_factory=StageRuntime)  # never in the key (a dict given is typed)
    impossible: Optional[str] = None  # the plan's reason, when it rules the target out
    host: Optional[HostNeed] = None  # what the node needs of the host
    after: list[str] = field(default_factory=list)  # nodes that must succeed first, not part of the key
    texts: dict[str, TextInput] = field(default_factory=dict)  # role -> a text whose content is a key input
    serves: Optional[str] = None  # the target this node exists for (its validations, an engine's twin)

    def __post_init__(self) -> None:
        self.runtime = StageRuntime.of(self.runtime)

    def param_values(self) -> dict[str, Any]:
        return {k: p.value for k, p in self.params.items()}

    def ruled_out(self) -> Optional[CannotRun]:
        """What stops the node on any host: the plan, or no stage for its kind."""
        if self.impossible:
            return CannotRun(Blocker.PLAN, self.impossible)
        if self.stage is None:
            return CannotRun(Blocker.NO_STAGE, NOT_YET.format(kind=self.kind.replace(":", " ")))
        return None

    def host_problem(self) -> Optional[CannotRun]:
        """What stops the node on this host: its hardware or runtime, then the stage's packages."""
        problem = self.host.problem() if self.host else None
        if problem:
            return CannotRun(Blocker.HOST, problem)
        missing = self.stage.missing_packages() if self.stage else []
        if missing:
            return CannotRun(Blocker.INSTALL, install_hint(missing))
        return None

    def text_digests(self, state=None) -> dict[str, str]:
        return {role: text.digest(state) for role, text in self.texts.items()}


@dataclass
class Graph:
    recipe: str
    nodes: list[Node]  # topological order

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def validations_of(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes if n.kind == "validate" and n.serves == node_id]

    def closure(self, ids: set[str]) -> "Graph":
        """The nodes named and everything they depend on, in order."""
        keep = set(ids)
        for node in reversed(self.nodes):
            if node.id in keep:
                keep |= set(node.inputs.values()) | set(node.after)
        return Graph(self.recipe, [n for n in self.nodes if n.id in keep])


def field_param(model: BaseModel, name: str, path: str, value: Any = None) -> Param:
    """A recipe field with its origin: set in the recipe, or the schema's default."""
    origin = "recipe" if name in model.model_fields_set else "default"
    return Param(getattr(model, name) if value is None else value, f"{origin}: {path}")


class GraphBuilder:
    """Adds the nodes of a plan, one method per kind; shared nodes (the source, a calibration set,
    a variant's quantized model, the reference) are added once and found again."""

    def __init__(self, plan: Plan, registry: Optional[dict[str, Optional[Stage]]] = None, validate: bool = True):
        self.plan, self.recipe, self.loaded = plan, plan.recipe, plan.loaded
        self.registry = STAGES if registry is None else registry
        self.validate = validate
        self.nodes: list[Node] = []
        self.calibrations: dict[tuple, str] = {}  # calibration settings -> node id (shared by variants)
        self.quantized: dict[str, str] = {}  # variant -> node id of its quantized model
        self.calibration_of: dict[str, str] = {}  # quantized node id -> its calibration node id
        self.validations: dict[str, str] = {}  # checkpoint target -> its validate node

    def graph(self) -> Graph:
        self.source()
        for target in self.plan.targets:
            if target.kind in (CHECKPOINT, HF_CHECKPOINT):
                self.checkpoint(target)
            elif target.kind == ENGINE:
                self.engine_target(target)
            elif target.kind == GGUF:
                self.gguf(target)
        return Graph(self.recipe.name, self.nodes)

    # ---- helpers ----
    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def _find(self, node_id: str) -> Optional[Node]:
        return next((n for n in self.nodes if n.id == node_id), None)

    def _dtype(self) -> Param:
        return Param(self.plan.dtype, "recipe: dtype" if self.recipe.dtype else "model config (or float16)")

    def _variant_params(self, node: Node, vname: str) -> None:
        variant, vpath = self.recipe.variants[vname], f"variants.{vname}"
        node.params["quant"] = field_param(variant, "quant", f"{vpath}.quant")
        node.params["kv_cache"] = field_param(variant, "kv_cache", f"{vpath}.kv_cache")
        if variant.effective_group_size:
            node.params["group_size"] = field_param(variant, "group_size", f"{vpath}.group_size", variant.effective_group_size)

    def _gates(self, vname: str) -> Param:
        variant = self.recipe.variants[vname]
        if variant.gguf:  # llama.cpp's type decides the family
            family = quantformats.GGUF_TYPES[variant.gguf].family
            limits, default_origin = gates.default_gates_of_family(family), f"{family} quantization ({variant.gguf})"
        else:
            limits, default_origin = gates.default_gates(variant.quant, variant.kv_cache), f"{gates.FAMILY[variant.quant]} quantization"
        set_gates = self.recipe.validation.gates.model_dump(exclude_none=True)
        limits.update(set_gates)
        return Param(limits, "recipe: validate.gates" if set_gates else f"default gates for {default_origin}")

    # ---- one method per kind of node ----
    def source(self) -> str:
        source = self.recipe.source
        # a .nemo object named by `s3:` is a NeMo source like any other
        kind = "nemo" if source.kind == "s3" and source.location.rstrip("/").endswith(".nemo") else source.kind
        node = Node(SOURCE, "source", self.registry.get(f"source:{kind}"))
        node.params["kind"] = Param(kind, f"recipe: source.{source.kind}")
        if source.kind == "gguf":
            node.params["dtype"] = self._dtype()
        node.runtime = StageRuntime(kind=kind, location=source.location, base_dir=str(self.loaded.base_dir),
                                    trust_remote_code=source.trust_remote_code)
        if source.kind == "hf":
            node.runtime.revision = source.revision or "main"
            node.runtime.where = self.loaded.where(("source", "hf"))  # named by a hub it cannot reach
        if source.kind == "path":
            node.runtime.folder = str(self.loaded.resolve_path(source.path))
        self._add(node)
        return node.id

    def calibration(self, vname: str) -> str:
        """Tokenized calibration windows: keyed by the text's content, not its path."""
        variant, vpath = self.recipe.variants[vname], f"variants.{vname}"
        settings = self.recipe.calibration_for(vname)
        signature = (settings.text, settings.samples, settings.seq_len, settings.seed)
        if signature in self.calibrations:
            return self.calibrations[signature]
        node_id = "calibration" if not self.calibrations else f"calibration-{vname}"
        node = Node(node_id, "calibration", self.registry.get("calibration"), inputs={"source": SOURCE})
        for name in ("samples", "seq_len", "seed"):
            overridden = variant.calibration is not None and name in variant.calibration.model_fields_set
            origin = (f"recipe: {vpath}.calibration.{name}" if overridden
                      else field_param(self.recipe.calibration, name, f"calibration.{name}").origin)
            node.params[name] = Param(getattr(settings, name), origin)
        node.runtime = StageRuntime(text=settings.text, base_dir=str(self.loaded.base_dir))
        node.texts["text"] = text_input("calibration", settings.text, str(self.loaded.base_dir))
        self.calibrations[signature] = node_id
        self._add(node)
        return node_id

    def quantize(self, vname: str) -> str:
        """The variant's calibrated, quantized model (its ModelOpt state): computed once, exported
        to every parallelism and to the Hugging Face form."""
        if vname in self.quantized:
            return self.quantized[vname]
        variant = self.recipe.variants[vname]
        calibration = self.calibration(vname)
        node = Node(quantized_id(vname), "quantize", self.registry.get("quantize"),
                    inputs={"source": SOURCE, "calibration": calibration})
        node.params["dtype"] = self._dtype()
        self._variant_params(node, vname)
        device = self.recipe.calibration_for(vname).device
        overridden = variant.calibration is not None and "device" in variant.calibration.model_fields_set
        node.platform["device"] = (Param(device, f"recipe: variants.{vname}.calibration.device") if overridden
                                   else field_param(self.recipe.calibration, "device", "calibration.device"))
        node.runtime.device = device
        node.host = host_need("quantize", variant.quant, variant.kv_cache, device)
        self.quantized[vname] = node.id
        self.calibration_of[node.id] = calibration
        self._add(node)
        return node.id

    def reference(self) -> str:
        """Teacher-forced top-k log-probabilities of the source on the evaluation set: once per
        source and evaluation settings, shared by every variant."""
        if self._find("reference"):
            return "reference"
        settings = self.recipe.validation
        node = Node("reference", "reference", self.registry.get("reference"), inputs={"source": SOURCE})
        for name in ("samples", "seq_len"):
            node.params[name] = field_param(settings, name, f"validate.{name}")
        node.params["seed"] = Param(0, "fixed: evaluation windows do not move")
        node.params["dtype"] = self._dtype()  # the candidates' dtype: only quantization may differ
        node.params["top_k"] = Param(gates.TOP_K, "trtbuild: top-k log-probabilities stored per position")
        node.platform["device"] = field_param(settings, "device", "validate.device")
        node.runtime = StageRuntime(text=settings.text, base_dir=str(self.loaded.base_dir), device=settings.device)
        node.texts["text"] = text_input("evaluation", settings.text, str(self.loaded.base_dir))
        self._add(node)
        return node.id

    def checkpoint(self, target: Target) -> str:
        """A TensorRT-LLM checkpoint (per tp/pp) or a Hugging Face checkpoint, and its validations.
        A Hugging Face checkpoint is two nodes: the export (the weights) and the package (the
        export's files plus serving/: the runtime options and the loader check)."""
        variant = self.recipe.variants[target.variant]
        inputs = {"source": SOURCE}
        # A TensorRT-LLM checkpoint of a format TensorRT-LLM quantizes at load (int8_wo) is the
        # source's float weights, converted: no calibration (quantformats.trtllm_checkpoint_calibrated).
        calibrated = variant.needs_calibration and (
            target.kind != CHECKPOINT or quantformats.trtllm_checkpoint_calibrated(variant.quant, variant.kv_cache))
        if calibrated and target.ok:
            inputs["quantized"] = self.quantize(target.variant)
        mode = "export" if calibrated else "convert"
        kind = "hf-export" if target.kind == HF_CHECKPOINT else target.kind
        node_id = hf_export_id(target.name) if target.kind == HF_CHECKPOINT else target.name
        node = self._add(Node(node_id, kind, self.registry.get(f"{kind}:{mode}"), inputs=inputs,
                              impossible=target.reason))
        node.params["dtype"] = self._dtype()
        self._variant_params(node, target.variant)
        if target.kind == CHECKPOINT:
            node.params["tp"] = Param(target.tp, "recipe: parallelism")
            node.params["pp"] = Param(target.pp, "recipe: parallelism")
        else:
            self.hf_package(target, node.id)
        if self.validate and target.ok:
            # torch validation reads the weights (the export); TensorRT-LLM serves the package (its options)
            self.validations[target.name] = self.torch_validation(target, inputs, node.id)
            if target.kind == HF_CHECKPOINT:
                self.trtllm_validation(target.name, target.variant, "hf", target.name, {})
                self.vllm_validation(target.name, target.variant)
        return target.name

    def hf_package(self, target: Target, export: str) -> Node:
        """The hf-checkpoint target: its export's files (not copied: the runner overlays them) plus
        serving/ derived from these parameters. Its key holds what the options are made of, the
        export's key none of it: new limits re-package a cached export."""
        node = self._add(Node(target.name, HF_CHECKPOINT, self.registry.get(f"{HF_CHECKPOINT}:package"),
                              inputs={"weights": export}, impossible=target.reason))
        limits = self.recipe.limits
        values = {name: getattr(limits, name) for name in ("max_batch_size", "max_num_tokens", "max_input_len")}
        values["max_seq_len"] = self.plan.max_seq_len
        origins = {name: field_param(limits, name, f"limits.{name}").origin for name in values}
        origins["max_seq_len"] = ("recipe: limits.max_seq_len" if limits.max_seq_len
                                  else "model config (max_position_embeddings x rope factor)")
        node.params["limits"] = Param(values, "; ".join(f"{k} {o}" for k, o in origins.items()), parts=origins)
        node.params["dtype"] = self._dtype()
        self._variant_params(node, target.variant)
        node.params["parallelism"] = Param([{"tp": p.tp, "pp": p.pp} for p in self.recipe.parallelism],
                                           "recipe: parallelism (one option set per entry)")
        node.params["memory_fraction"] = field_param(self.recipe.serving, "memory_fraction", "serving.memory_fraction")
        node.params["runtimes"] = Param(serving_options.runtime_versions(),
                                        "trtbuild: the runtime argument lists the options are checked against")
        node.params["serving_table"] = Param(serving.TABLE_VERSION, "trtbuild: the serving support table "
                                             "(trtbuild/facts/serving.py) the loader check's per-SM verdicts come from")
        if target.ok:  # an option the pinned runtimes do not know fails here, at plan time
            serving_options.check_params(node.param_values())
        return node

    def gguf_converted(self) -> str:
        """The source as llama.cpp's converter writes it (one GGUF in the recipe's dtype, its tokenizer
        inside): every gguf variant is quantized from it."""
        if self._find(GGUF_CONVERTED):
            return GGUF_CONVERTED
        node = self._add(Node(GGUF_CONVERTED, "gguf-convert", self.registry.get("gguf-convert"), inputs={"source": SOURCE}))
        node.params["outtype"] = Param(GGUF_OUTTYPE[self.plan.dtype], f"{self._dtype().origin}: convert_hf_to_gguf.py --outtype")
        return node.id

    def gguf(self, target: Target) -> str:
        """A gguf target: llama.cpp's quantizer run on the converted source, with serving/ (the
        llama.cpp server's command), then its validation by llama.cpp itself."""
        variant, vpath = self.recipe.variants[target.variant], f"variants.{target.variant}"
        inputs = {"converted": self.gguf_converted()} if target.ok else {}
        node = self._add(Node(target.name, GGUF, self.registry.get(GGUF), inputs=inputs, impossible=target.reason))
        gguf_type = quantformats.GGUF_TYPES[variant.gguf]
        node.params["gguf"] = field_param(variant, "gguf", f"{vpath}.gguf")
        node.params["ftype"] = Param(gguf_type.ftype, f"llama.cpp: enum llama_ftype of {gguf_type.name} ({quantformats.LLAMA_CPP_SOURCE}: include/llama.h)")
        limits = self.recipe.limits
        node.params["n_ctx"] = Param(self.plan.max_seq_len, "recipe: limits.max_seq_len" if limits.max_seq_len
                                     else "model config (max_position_embeddings x rope factor)")
        node.params["n_batch"] = field_param(limits, "max_num_tokens", "limits.max_num_tokens")
        if self.validate and target.ok:
            self.llamacpp_validation(target.name, target.variant)
        return node.id

    def llamacpp_validation(self, target: str, vname: str) -> str:
        """The GGUF as llama.cpp computes it, against the same reference and the gates of its family."""
        node = Node(validate_id(target), "validate", self.registry.get("validate:llamacpp"),
                    inputs={"reference": self.reference(), "gguf": target}, serves=target)
        node.params["gates"] = self._gates(vname)
        node.params["runner"] = Param("llamacpp", "trtbuild: GGUF files are validated as llama.cpp computes them")
        node.runtime = StageRuntime(target=target)
        self._add(node)
        return node.id

    def torch_validation(self, target: Target, target_inputs: dict[str, str], weights: str) -> str:
        """The target's accuracy against the reference. A quantized variant is validated through its
        restored ModelOpt model (the same for every parallelism: one key, computed once); an
        unquantized checkpoint through its own files read back."""
        inputs = {"reference": self.reference(), "source": SOURCE}
        if "quantized" in target_inputs:
            inputs["quantized"] = target_inputs["quantized"]
            inputs["calibration"] = self.calibration_of[target_inputs["quantized"]]
        else:
            inputs["checkpoint" if target.kind == CHECKPOINT else "hf_checkpoint"] = weights
        node = Node(validate_id(target.name), "validate", self.registry.get("validate"), inputs=inputs,
                    after=[target.name], serves=target.name)
        node.params["dtype"] = self._dtype()
        node.params["gates"] = self._gates(target.variant)
        node.params["runner"] = Param("torch", "trtbuild: checkpoints are validated on torch before any engine")
        node.platform["device"] = field_param(self.recipe.validation, "device", "validate.device")
        node.runtime = StageRuntime(device=self.recipe.validation.device, target=target.name)
        self._add(node)
        return node.id

    def engine(self, target: Target, gather: bool, twin: bool = False) -> Node:
        """An engine target, or (`twin`) the copy built only to be validated: the same flags plus
        --gather_context_logits, which TensorRT-LLM needs to return prompt logits."""
        image = self.recipe.toolchain.image
        node = Node(twin_id(target.name) if twin else target.name, ENGINE,
                    self.registry.get(f"{ENGINE}:image" if image else ENGINE),
                    inputs={"checkpoint": target.depends_on[0]}, impossible=target.reason,
                    serves=target.name if twin else None)
        limits = self.recipe.limits
        for name in ("max_batch_size", "max_input_len", "max_num_tokens", "max_beam_width"):
            node.params[name] = field_param(limits, name, f"limits.{name}")
        node.params["max_seq_len"] = Param(self.plan.max_seq_len, "recipe: limits.max_seq_len" if limits.max_seq_len
                                           else "model config (max_position_embeddings x rope factor)")
        variant = self.recipe.variants[target.variant]
        fmt = engine_flags.EngineFormat(variant.quant, variant.kv_cache, self.plan.dtype, target.gpu)
        gather_why = f"validate.engines: {self.recipe.validation.engines}" if gather else None
        # the complete flag set (recipe + rules: trtbuild/plan/engine_flags.py), each with its origin
        flags = engine_flags.engine_flags(self.recipe.engine.flags, fmt, gather_why)
        node.params["flags"] = Param({name: f.value for name, f in flags.items()},
                                     "recipe: engine.flags and trtbuild's rules (see each flag)",
                                     parts={name: f.origin for name, f in flags.items()})
        node.platform["sm"] = Param(target.gpu, "target: the engine's GPU architecture")
        node.host = host_need(ENGINE, target.gpu, self.recipe.toolchain.tensorrt_llm, image)
        if image:
            node.runtime.image = image
        if target.ok:  # the stage refuses early on a host with less (estimate.build_memory_needs)
            from trtbuild.plan.estimate import build_memory_needs

            one = build_memory_needs(self.plan, target, workers=1)
            node.runtime.build_needs = BuildNeeds(host_ram_bytes_per_worker=one.host_ram_bytes,
                                                  gpu_bytes_per_worker=one.gpu_bytes_per_worker)
        return node

    def engine_target(self, target: Target) -> None:
        """An engine with what it waits for: its checkpoint's validation, and per validate.engines
        its own validation (through a twin, or on itself)."""
        mode = self.recipe.validation.engines if self.validate and target.ok else "none"
        checkpoint_validation = self.validations.get(target.depends_on[0])
        node = self.engine(target, gather=mode == "published")
        if checkpoint_validation:  # no GPU time for a checkpoint that failed its gates
            node.after = [checkpoint_validation]
        if mode == "twin":  # the twin is built and validated first; the published engine after it passes
            twin = self._add(self.engine(target, gather=True, twin=True))
            twin.after = list(node.after)
            node.after.append(self.trtllm_validation(target.name, target.variant, "engine", twin.id, twin.platform))
        self._add(node)
        if mode == "published":
            self.trtllm_validation(target.name, target.variant, "engine", node.id, node.platform)

    def trtllm_validation(self, target: str, vname: str, backend: str, candidate: str, platform: dict) -> str:
        """The candidate as TensorRT-LLM serves it (an engine, or an hf-checkpoint on the PyTorch
        backend), against the same reference and gates as its checkpoint."""
        role = "engine" if backend == "engine" else "hf_checkpoint"
        inputs = {"reference": self.reference(), role: candidate}
        if vname in self.quantized:  # to say when evaluation and calibration windows overlap
            inputs["calibration"] = self.calibration_of[self.quantized[vname]]
        node = Node(validate_id(target) if backend == "engine" else trtllm_validate_id(target), "validate",
                    self.registry.get("validate:trtllm"), inputs=inputs,
                    after=[] if backend == "engine" else [validate_id(target)], serves=target)
        node.params["gates"] = self._gates(vname)
        node.params["runner"] = Param("tensorrt_llm", f"trtbuild: {'engines' if backend == 'engine' else 'hf-checkpoints'} "
                                      "are validated as TensorRT-LLM runs them")
        node.params["backend"] = Param(backend, "trtbuild: the TensorRT backend for engines, PyTorch for hf-checkpoints")
        node.platform.update(platform)
        node.runtime = StageRuntime(target=target)
        series = ".".join(self.recipe.toolchain.tensorrt_llm.split(".")[:2])  # engines: the recipe's pinned line
        node.host = host_need("validate:trtllm", backend, series)
        self._add(node)
        return node.id

    def vllm_validation(self, target: str, vname: str) -> str:
        """The packaged hf-checkpoint as vLLM loads it (its serving/vllm_args.json, or options derived
        from the recipe's values below), against the same reference and gates as its checkpoint."""
        inputs = {"reference": self.reference(), "hf_checkpoint": target}
        if vname in self.quantized:  # to say when evaluation and calibration windows overlap
            inputs["calibration"] = self.calibration_of[self.quantized[vname]]
        node = Node(vllm_validate_id(target), "validate", self.registry.get("validate:vllm"), inputs=inputs,
                    after=[validate_id(target)], serves=target)
        node.params["gates"] = self._gates(vname)
        node.params["runner"] = Param("vllm", "trtbuild: hf-checkpoints are validated as vLLM loads them")
        node.params["dtype"] = self._dtype()
        self._variant_params(node, vname)
        limits = self.recipe.limits
        node.params["max_seq_len"] = Param(self.plan.max_seq_len, "recipe: limits.max_seq_len" if limits.max_seq_len
                                           else "model config (max_position_embeddings x rope factor)")
        node.runtime = StageRuntime(target=target)
        variant = self.recipe.variants[vname]
        node.host = host_need("validate:vllm", variant.quant, variant.kv_cache)
        self._add(node)
        return node.id


def build_graph(plan: Plan, registry: Optional[dict[str, Optional[Stage]]] = None, validate: bool = True) -> Graph:
    return GraphBuilder(plan, registry, validate).graph()
