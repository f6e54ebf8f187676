"""The recipe: a pydantic schema (schema: 1) and YAML loading with `file:line:col: yaml.path: ...` errors."""

from __future__ import annotations

import re
import typing
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from trtbuild.recipe.bench import Bench, Workload  # noqa: F401 (docs/recipe.md documents both here)
from trtbuild.facts import gpus as gpu_facts
from trtbuild.facts import quantformats
from trtbuild.facts import trtllm
from trtbuild.errors import InvalidInput
from trtbuild.recipe.yamlerrors import format_errors, yaml_type
from trtbuild.recipe.yamlsource import LocatedDocument, format_path, load_located_file

QuantName = Literal[quantformats.QUANT_NAMES]  # the names of trtbuild/facts/quantformats.py's table
KvCacheName = Literal[quantformats.KV_CACHE_NAMES]
DType = Literal["float16", "bfloat16", "float32"]
Backend = Literal["engine", "hf-checkpoint", "gguf"]
GgufTypeName = Literal[quantformats.GGUF_TYPE_NAMES]  # llama-quantize's names (trtbuild/facts/quantformats.py)
Device = Literal["auto", "cpu", "cuda"]
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
# A tag can move; a digest cannot, and the key must name exactly what built the engine.
IMAGE_PATTERN = r"^[^\s@]+@sha256:[0-9a-f]{64}$"


def _known_gpu(name: str) -> str:
    gpu_facts.resolve_gpu(name)  # raises ValueError with the list of known names
    return name


GpuName = Annotated[str, AfterValidator(_known_gpu)]
# Counts and sizes: TensorRT-LLM holds them in 32-bit integers, so a larger one is a typo, refused
# here rather than overflowing in a stage hours later. Seeds are bounded to what 64 bits hold.
INT32_MAX = 2**31 - 1
Count = Annotated[int, Field(gt=0, le=INT32_MAX)]
SEED_MAX = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)


class Source(_Strict):
    """Where the weights come from: exactly one of hf, nemo, path, gguf, s3."""

    hf: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$", description="ORG/REPO on the Hugging Face Hub")
    revision: Optional[str] = Field(None, min_length=1, description="branch, tag or commit of `hf` (default main)")
    nemo: Optional[str] = Field(None, min_length=1, description="a .nemo file, a NeMo 2 folder, or an s3:// URL to either")
    path: Optional[str] = Field(None, min_length=1, description="a local Hugging Face model folder")
    gguf: Optional[str] = Field(
        None, min_length=1,
        description="a GGUF file; `pkg:DIST_MODULE/FILE` names a file inside an installed Python package",
    )
    s3: Optional[str] = Field(None, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", description="s3://BUCKET/PREFIX")
    trust_remote_code: bool = Field(
        False, description="accept a Hugging Face model whose config.json names custom code (`auto_map`): such a "
        "source is refused unless this is true (default false)")
    config: Optional[str] = Field(
        None, min_length=1, description="a local config.json that `plan` reads instead of the source's own (an "
        "offline override; without it plan reads the folder's, the hub's, the S3 prefix's config.json, the GGUF "
        "header or the NeMo model config)"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> "Source":
        given = [k for k in SOURCE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            raise ValueError(f"exactly one of {', '.join(SOURCE_KINDS)} is required (found: {found})")
        if self.revision is not None and self.hf is None:
            raise ValueError("revision applies only to an hf source")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SOURCE_KINDS if getattr(self, k) is not None)

    @property
    def location(self) -> str:
        return getattr(self, self.kind)

    def describe(self) -> str:
        if self.hf is not None:
            return f"hf:{self.hf}@{self.revision or 'main'}"
        return f"{self.kind}:{self.location}"


SOURCE_KINDS = ("hf", "nemo", "path", "gguf", "s3")


class Calibration(_Strict):
    """The calibration set ModelOpt quantizes with (its token ids are hashed into the checkpoint key)."""

    text: str = Field("builtin", min_length=1, description="`builtin`, or a text file or folder of text files")
    samples: Count = Field(512, description="number of calibration windows (default 512)")
    seq_len: Count = Field(512, description="tokens per calibration window (default 512)")
    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed that picks the windows from the text (default 0); the same seed "
                      "and text give the same windows")
    device: Device = Field("auto", description="where ModelOpt calibrates: `auto` (CUDA when this host has an NVIDIA "
                           "GPU, else CPU), `cpu` or `cuda`; part of the key, since results differ in the last bits")


class CalibrationOverride(_Strict):
    """Per-variant calibration: only the fields given replace the top-level calibration's."""

    text: Optional[str] = Field(None, min_length=1, description="replaces calibration.text for this variant")
    samples: Optional[Count] = Field(None, description="replaces calibration.samples for this variant")
    seq_len: Optional[Count] = Field(None, description="replaces calibration.seq_len for this variant")
    seed: Optional[int] = Field(None, ge=0, le=SEED_MAX, description="replaces calibration.seed for this variant")
    device: Optional[Device] = Field(None, description="replaces calibration.device for this variant (`auto`, `cpu`, `cuda`)")


class Variant(_Strict):
    """One quantization of the model; `{}` builds it unquantized."""

    quant: Optional[QuantName] = Field(
        None, description="weight (and activation) quantization, a ModelOpt qformat: `fp8`, `int8_sq` (SmoothQuant), "
        "`int4_awq`, `w4a8_awq`, `int8_wo`, `int4_wo` (weight-only), `nvfp4`; unset: the recipe's dtype")
    kv_cache: Optional[KvCacheName] = Field(
        None, description="KV-cache quantization: `fp8`, `int8` or `nvfp4`; unset: the KV cache is kept in the dtype")
    group_size: Optional[Count] = Field(
        None, description="block size along the input dimension of the grouped INT4 formats (default 128)")
    calibration: Optional[CalibrationOverride] = Field(
        None, description="fields that replace the top-level calibration's for this variant only")
    gguf: Optional[GgufTypeName] = Field(
        None, description="a llama.cpp file type (`Q8_0`, `Q4_K_M`, `Q6_K`, `Q5_K_M`, `Q4_0`): the variant is a GGUF "
        "that llama.cpp's own converter and quantizer make from the source (backend `gguf`); it takes no other field")

    @model_validator(mode="after")
    def _gguf_alone(self) -> "Variant":
        # llama.cpp quantizes the source's float weights itself: a ModelOpt format or calibration has no say
        if self.gguf is not None:
            others = [name for name in ("quant", "kv_cache", "group_size", "calibration") if getattr(self, name) is not None]
            if others:
                raise ValueError(f"a gguf variant is llama.cpp's quantization of the source: {', '.join(others)} "
                                 "cannot be set beside gguf (make a separate variant)")
        return self

    @model_validator(mode="after")
    def _group_size_only_for_grouped(self) -> "Variant":
        if self.group_size is not None and self.quant not in quantformats.GROUPED:
            grouped = quantformats.GROUPED
            raise ValueError(f"group_size applies only to {', '.join(grouped[:-1])} and {grouped[-1]}")
        return self

    @property
    def effective_group_size(self) -> Optional[int]:
        fmt = quantformats.FORMATS.get(self.quant) if self.quant else None
        if fmt is not None and fmt.grouped:
            return self.group_size or fmt.default_group_size
        return None

    @property
    def needs_calibration(self) -> bool:
        return self.quant is not None or self.kv_cache is not None

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends that build this variant: a gguf variant only the gguf backend, others the rest."""
        return ("gguf",) if self.gguf else ("engine", "hf-checkpoint")


class Parallelism(_Strict):
    """One tensor x pipeline split: an engine runs on tp * pp GPUs."""

    tp: Count = Field(1, description="tensor-parallel degree: GPUs each layer is split over (default 1)")
    pp: Count = Field(1, description="pipeline-parallel degree: stages the layers are split into (default 1)")


class Limits(_Strict):
    """Engine limits; defaults are trtllm-build's (BuildConfig), max_seq_len from the model config."""

    max_batch_size: Count = Field(
        trtllm.build_default("max_batch_size"),
        description=f"most requests an engine serves at once (trtllm-build default {trtllm.build_default('max_batch_size')})")
    max_input_len: Count = Field(
        trtllm.build_default("max_input_len"),
        description=f"most prompt tokens per request (trtllm-build default {trtllm.build_default('max_input_len')}); "
        "at most max_seq_len")
    max_seq_len: Optional[Count] = Field(
        None, description="most tokens per request, prompt and output together; unset: the model's positions "
        "(max_position_embeddings, times the rope scaling factor where it applies), 2048 when the config has none; "
        "at most those positions")
    max_num_tokens: Count = Field(
        trtllm.build_default("max_num_tokens"),
        description=f"most tokens in one forward pass over the whole batch (trtllm-build default "
        f"{trtllm.build_default('max_num_tokens')}); sizes the activation memory")
    max_beam_width: Count = Field(
        trtllm.build_default("max_beam_width"),
        description=f"most beams of beam search (trtllm-build default {trtllm.build_default('max_beam_width')}; "
        "1 means no beam search)")


class Serving(_Strict):
    """How an hf-checkpoint's runtime options (serving/ in the artifact) share the GPU's memory."""

    memory_fraction: float = Field(
        0.9, gt=0, le=1, description="share of GPU memory for the runtime (default 0.9, TensorRT-LLM's "
        "KvCacheConfig.free_gpu_memory_fraction default): TensorRT-LLM's kv_cache_config.free_gpu_memory_fraction "
        "(of the memory free after the weights), vLLM's --gpu-memory-utilization and SGLang's "
        "--mem-fraction-static (of the whole GPU, weights included)")


class Toolchain(_Strict):
    tensorrt_llm: str = Field(trtllm.DEFAULT_TENSORRT_LLM, description="TensorRT-LLM version engines are built with")
    image: Optional[str] = Field(None, description="container image that holds the toolchain, "
                                 "pinned by digest (`nvcr.io/nvidia/tensorrt-llm/release@sha256:<64 hex>`): engines are "
                                 "built in it with `docker run`, and their keys name the image")


    @field_validator("image")
    @classmethod
    def _pinned_by_digest(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.fullmatch(IMAGE_PATTERN, value):
            raise ValueError(f"{value!r} is not pinned by digest: name the image as NAME@sha256:<64 hex digits> "
                             "(`docker inspect --format '{{index .RepoDigests 0}}' IMAGE`); a tag can move")
        return value


class Engine(_Strict):
    flags: dict[str, Any] = Field(
        default_factory=dict, description="extra trtllm-build options, checked against the pinned version's flags"
    )


class Exclude(_Strict):
    """Drops every target that matches all the fields given."""

    variant: Optional[str] = Field(None, description="a variant name of this recipe")
    tp: Optional[Count] = Field(None, description="a tensor-parallel degree")
    pp: Optional[Count] = Field(None, description="a pipeline-parallel degree")
    gpu: Optional[GpuName] = Field(None, description="an SM (`sm90`) or a product (`H100`, matched by its SM); "
                                   "matches engine targets only")
    backend: Optional[Backend] = Field(None, description="`engine`, `hf-checkpoint` or `gguf`")

    @model_validator(mode="after")
    def _not_empty(self) -> "Exclude":
        if all(getattr(self, f) is None for f in type(self).model_fields):
            raise ValueError("an exclude entry needs at least one of variant, tp, pp, gpu, backend")
        return self


class Gates(_Strict):
    kld_mean: Optional[float] = Field(None, ge=0, allow_inf_nan=False, description="largest mean KL divergence to the reference, in nats "
                                      "per token; unset: the family's default")
    kld_p99: Optional[float] = Field(None, ge=0, allow_inf_nan=False, description="largest 99th-percentile per-token KL divergence, in nats; "
                                     "unset: the family's default")
    top1_agreement: Optional[float] = Field(None, ge=0, allow_inf_nan=False, le=1, description="smallest share (0-1) of tokens whose most "
                                            "likely next token is the reference's; unset: the family's default")
    ppl_delta_pct: Optional[float] = Field(None, ge=0, allow_inf_nan=False, description="largest perplexity increase over the reference, in "
                                           "percent; unset: the family's default")


class Validate(_Strict):
    """Accuracy validation of every checkpoint (and engine) against the unquantized source."""

    text: str = Field("builtin", min_length=1, description="evaluation text: `builtin` (the docstrings of Python's "
                      "standard library modules, no text shared with the calibration default), or a text file or "
                      "folder of .txt/.md/.rst files, relative to the recipe")
    samples: Count = Field(32, description="number of evaluation windows (default 32)")
    seq_len: Count = Field(512, description="tokens per evaluation window (default 512)")
    device: Device = Field("auto", description="where the torch runner evaluates the reference and the checkpoints: "
                           "`auto` (CUDA when this host has an NVIDIA GPU, else CPU), `cpu` or `cuda`")
    gates: Gates = Field(default_factory=Gates, description="limits a target must meet; each unset limit is the "
                         "default of the variant's quantization family (unquantized, 8-bit, 4-bit)")
    engines: Literal["twin", "published", "none"] = Field(
        "twin", description="how engines are validated (they need --gather_context_logits): `twin` builds and "
        "validates a copy with that flag, `published` builds the published engine with it, `none` validates "
        "only their checkpoints")


S3_STORE_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"


class Publish(_Strict):
    store: Optional[str] = Field(
        None, min_length=1, description="the shared store: s3://BUCKET/PREFIX or a folder (relative to the recipe). "
        "push, pull and ls use it when --store is not given; build reads through it (and --push publishes there) "
        "when it is s3://; the lock file records it")

    @field_validator("store")
    @classmethod
    def _a_store(cls, value: Optional[str]) -> Optional[str]:
        # A folder has no scheme; an s3:// URL names a valid bucket. Anything else is a typo.
        if value is not None and ("://" in value and not re.match(S3_STORE_PATTERN, value)):
            raise ValueError(f"{value!r} is not a store: a folder or s3://BUCKET/PREFIX")
        return value


class Recipe(_Strict):
    """A trtbuild recipe: one source model and the matrix of artifacts to build from it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True, title="trtbuild recipe")

    schema_version: Literal[1] = Field(alias="schema", description="version of the recipe format: 1")
    name: str = Field(pattern=NAME_PATTERN, description="the recipe's name (lowercase letters, digits, `.`, `_`, `-`): "
                      "names its refs in the store and its report")
    source: Source = Field(description="the model to build from: exactly one of hf, nemo, path, gguf, s3")
    dtype: Optional[DType] = Field(None, description="`float16`, `bfloat16` or `float32`: the dtype of unquantized "
                                   "weights and activations; default: the model config's dtype, else float16")
    variants: dict[Annotated[str, Field(pattern=NAME_PATTERN)], Variant] = Field(
        default_factory=lambda: {"base": Variant()}, min_length=1,
        description="name -> quantization to build; `{}` is unquantized (default: `{base: {}}`)",
    )
    calibration: Calibration = Field(default_factory=Calibration,
                                     description="the calibration set of every quantized variant (a variant may override it)")
    parallelism: list[Parallelism] = Field(default_factory=lambda: [Parallelism()], min_length=1,
                                           description="the tp x pp splits to build (default `[{tp: 1, pp: 1}]`)")
    limits: Limits = Field(default_factory=Limits, description="engine limits (trtllm-build's defaults when unset)")
    serving: Serving = Field(default_factory=Serving, description="runtime options written into each "
                             "hf-checkpoint (serving/): the GPU memory share")
    gpus: list[GpuName] = Field(default_factory=list, description="SM names (`sm80` ... `sm120`) or GPU products "
                                "(`L4`, `H100`, ...): one engine per SM, which must fit the smallest product named for "
                                "it; required for the engine backend")
    backends: list[Backend] = Field(default_factory=lambda: ["engine"], min_length=1,
                                    description="`engine` (TensorRT engines, TensorRT-LLM 1.2.x) and/or `hf-checkpoint` "
                                    "(a quantized Hugging Face checkpoint for TensorRT-LLM's PyTorch backend, vLLM, "
                                    "SGLang) and/or `gguf` (llama.cpp's files of the variants that name a `gguf` type); "
                                    "default `[engine]`")
    toolchain: Toolchain = Field(default_factory=Toolchain, description="the TensorRT-LLM version (and image) engines "
                                 "are built with")
    engine: Engine = Field(default_factory=Engine, description="options of the engine build")
    exclude: list[Exclude] = Field(default_factory=list, description="partial matches of targets to drop; a checkpoint "
                                   "no remaining engine needs is dropped too")
    validation: Validate = Field(default_factory=Validate, alias="validate",
                                 description="accuracy validation: evaluation text, windows, device, gates")
    publish: Publish = Field(default_factory=Publish, description="where built artifacts are published")
    bench: Bench = Field(default_factory=Bench, description="serving workloads `trtbuild bench` drives against each "
                                                            "artifact (measurements, never part of a key)")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _schema_is_an_integer(cls, value: Any) -> Any:
        # Literal[1] compares by equality, so `true` and `1.0` would pass for 1.
        if value == 1 and type(value) is not int:
            raise ValueError(f"expected the integer 1, got {yaml_type(value)}")
        return value

    @field_validator("variants", mode="before")
    @classmethod
    def _empty_variant_is_unquantized(cls, value: Any) -> Any:
        # `base:` with no value is the same as `base: {}`.
        if isinstance(value, dict):
            return {k: ({} if v is None else v) for k, v in value.items()}
        return value

    def calibration_for(self, variant: str) -> Calibration:
        override = self.variants[variant].calibration
        if override is None:
            return self.calibration
        return self.calibration.model_copy(update=override.model_dump(exclude_none=True))

    def gpu_choices(self) -> list[gpu_facts.GpuChoice]:
        return [gpu_facts.resolve_gpu(g) for g in self.gpus]


DEFAULT_RECIPE = "smollm2-demo.yaml"


def default_recipe() -> Path:
    """The recipe embedded in the package: the bundled SmolLM2-135M demo."""
    return Path(str(resources.files("trtbuild").joinpath("recipes", DEFAULT_RECIPE)))


class LoadedRecipe(typing.NamedTuple):
    recipe: Recipe
    path: Path  # as the user named it
    doc: LocatedDocument

    @property
    def base_dir(self) -> Path:
        """Relative paths in a recipe are relative to the recipe file (symlinks resolved)."""
        return self.path.resolve().parent

    @property
    def embedded(self) -> bool:
        """Whether this is the package's default recipe, however it was named: a path that is its file
        (the repository's recipes/smollm2-demo.yaml is a link to it) is the embedded recipe, with one
        identity and one lock (in the store), not a second claimant of its name."""
        try:
            return self.path.samefile(default_recipe())
        except OSError:  # the package's file is not there (a zip import): only its own path would be
            return False

    def resolve_path(self, value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.base_dir / p

    def where(self, path: tuple) -> str:
        return self.doc.where(path)

    def command(self, verb: str) -> str:
        """The command that does `verb` to this recipe: bare for the embedded demo."""
        return f"trtbuild {verb}" if self.embedded else f"trtbuild {verb} {self.path}"


def load_recipe_or_demo(path: str | Path | None) -> LoadedRecipe:
    """RECIPE, or the embedded demo when it is None. `.embedded` of what it returns says whether it
    is the demo (also when RECIPE is a path to its file, as recipes/smollm2-demo.yaml is): its
    identity, its lock in the store and the commands that name it follow from that one fact."""
    return load_recipe(path or default_recipe())


def load_recipe(path: str | Path) -> LoadedRecipe:
    """Load, validate and cross-check a recipe; every problem raises InvalidInput (one line each)."""
    path = Path(path)
    doc = load_located_file(path)
    if not isinstance(doc.data, dict):
        raise InvalidInput(f"{doc.where(())}: a recipe is a YAML mapping (schema, name, source, ...)")
    try:
        recipe = Recipe.model_validate(doc.data)
    except ValidationError as exc:
        raise InvalidInput(*format_errors(exc, doc, Recipe)) from None
    problems = _cross_check(recipe)
    if problems:
        raise InvalidInput(*(f"{doc.where(p, key=at_key)}: {format_path(p)}: {msg}" for p, msg, at_key in problems))
    return LoadedRecipe(recipe, path, doc)


def _cross_check(recipe: Recipe) -> list[tuple[tuple, str, bool]]:
    """Rules beyond one field's type: (yaml path, message, whether to point at the key)."""
    problems: list[tuple[tuple, str, bool]] = []
    for name, value in recipe.engine.flags.items():
        reason = trtllm.check_flag(str(name), value)
        if reason:
            about_name = reason.startswith(("unknown", repr(name)))
            problems.append((("engine", "flags", name), reason, about_name))
    if "engine" in recipe.backends:
        reason = trtllm.check_engine_toolchain(recipe.toolchain.tensorrt_llm)
        if reason:
            problems.append((("toolchain", "tensorrt_llm"), reason, False))
        if not recipe.gpus:
            problems.append((("gpus",), "the engine backend needs at least one GPU (an SM such as sm90, or a product such as H100)", False))
    gguf_variants = [name for name, variant in recipe.variants.items() if variant.gguf]
    if "gguf" in recipe.backends and not gguf_variants:
        problems.append((("backends",), "the gguf backend builds the variants that name a llama.cpp type "
                         "(`gguf: Q8_0`, ...); no variant does", False))
    if gguf_variants and "gguf" not in recipe.backends:
        problems.append((("variants", gguf_variants[0], "gguf"), "a gguf variant needs `gguf` in backends", False))
    seen: dict[tuple[int, int], int] = {}
    for i, par in enumerate(recipe.parallelism):
        if (par.tp, par.pp) in seen:
            problems.append((("parallelism", i), f"tp={par.tp} pp={par.pp} is listed twice (also at index {seen[(par.tp, par.pp)]})", False))
        seen.setdefault((par.tp, par.pp), i)
    for i, rule in enumerate(recipe.exclude):
        if rule.variant is not None and rule.variant not in recipe.variants:
            problems.append((("exclude", i, "variant"), f"{rule.variant!r} is not a variant of this recipe ({', '.join(recipe.variants)})", False))
    return problems


def json_schema() -> dict:
    schema = Recipe.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def recipe_identity(loaded: LoadedRecipe) -> str:
    """What makes a recipe the same recipe on every host: its path inside its git work tree (CI
    checkouts differ only above it), else its absolute path; the package's default (by any path
    that is its file) is `embedded:`."""
    if loaded.embedded:
        return f"embedded:{DEFAULT_RECIPE}"
    path = loaded.path.resolve()
    for folder in path.parents:
        if (folder / ".git").exists():
            return path.relative_to(folder).as_posix()
    return str(path)
