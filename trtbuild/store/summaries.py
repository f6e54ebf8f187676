"""The typed stage summaries: what each stage kind writes as its report (report.json, an engine's
trtbuild.json, an hf-checkpoint's serving/report.json over its export's), and what the action
record copies into `summary`. One model per stage kind; `kind` tells them apart (a tagged union:
SUMMARY_MODELS maps the tag to its model, as pydantic's discriminated unions do by a literal).

The JSON is the one the stages have always written, so stored records and artifacts read as they
are: a summary's `kind` is its record's stage (`checkpoint:export` -> `checkpoint`) and is written
only where it always was (an engine's trtbuild.json, which a deploy host reads without a record);
a key a stage did not write is not written back (`written_keys`). A stage that wrote no report has
no summary (None; `{}` on disk).

Summaries trtbuild reads (engine, validation, hf-checkpoint's serving, reference, calibration) are
closed: an unknown field is refused. The reports of the tools a stage wraps (a NeMo conversion,
ModelOpt's quantization and exports, a checkpoint conversion) keep the tool's further fields as
JSON values (`extra="allow"`); trtbuild shows them (`cache ls`) and never reads them.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_serializer

from trtbuild.store.platform import EnginePlatform

# An integer stays an integer (a gate limit a recipe wrote as 2 is written back as 2, not 2.0:
# the report is part of the artifact, whose bytes must not change for the same key).
Number = Union[int, float]


class StageSummary(BaseModel):
    """What every stage summary has: the kind of stage that wrote it."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    kind: str = Field(exclude=True, description="The stage kind that wrote it: its record's stage up to the `:`.")

    @model_serializer(mode="wrap")
    def _as_written(self, handler) -> dict[str, Any]:
        """Only the keys the stage wrote: an optional field it left out stays out."""
        data = handler(self)
        return {key: value for key, value in data.items() if key in self.written_keys()}

    def written_keys(self) -> set[str]:
        fields = type(self).model_fields
        names = {(fields[name].alias or name) for name in self.model_fields_set if name in fields}
        return names | set(self.model_extra or {})


class OpenSummary(StageSummary):
    """A summary that also carries the wrapped tool's own report: its further fields are kept as
    JSON values, shown by `cache ls`, never read by trtbuild."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)


class SourceSummary(OpenSummary):
    """A source converted into a Hugging Face folder (GGUF, NeMo): what it holds. Adopted and
    downloaded sources write none."""

    kind: Literal["source"] = Field("source", exclude=True, description="Always `source`.")
    architecture: Optional[str] = Field(None, description="config.json's first architecture (None: none named).")
    parameters: Optional[int] = Field(None, ge=0, description="Parameters of the converted model.")
    dtype: Optional[Union[str, list[str]]] = Field(None, description="The dtype (or dtypes) of its tensors.")


class CalibrationSummary(StageSummary):
    """The calibration set: token windows cut from the recipe's text."""

    kind: Literal["calibration"] = Field("calibration", exclude=True, description="Always `calibration`.")
    samples: int = Field(ge=1, description="Windows in the set.")
    seq_len: int = Field(ge=1, description="Tokens per window.")
    tokens: int = Field(ge=0, description="Tokens in the whole text.")
    seed: int = Field(description="Seed of the windows' start offsets.")
    overlapping: bool = Field(description="True when the text is too short for disjoint windows.")
    starts: list[int] = Field(description="Token offset of each window in the text.")
    text_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the calibration text (UTF-8).")


class QuantizeSummary(OpenSummary):
    """ModelOpt's calibration and quantization of the source (its state, not the weights)."""

    kind: Literal["quantize"] = Field("quantize", exclude=True, description="Always `quantize`.")
    device: str = Field(description="Device the calibration ran on (`cpu`, `cuda:0`).")


class CheckpointSummary(OpenSummary):
    """A TensorRT-LLM checkpoint (converted or exported): the conversion's report."""

    kind: Literal["checkpoint"] = Field("checkpoint", exclude=True, description="Always `checkpoint`.")
    config_fixes: list[str] = Field(description="Corrections made to config.json (rope, Qwen fields), one per line.")


class HfExportSummary(OpenSummary):
    """A Hugging Face checkpoint's weights (cast or exported by ModelOpt): the export's report."""

    kind: Literal["hf-export"] = Field("hf-export", exclude=True, description="Always `hf-export`.")


class Serving(BaseModel):
    """serving/ of a packaged Hugging Face checkpoint: what the package stage wrote and decided."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    files: list[str] = Field(description="Files written under serving/, relative to the artifact.")
    runtimes: dict[str, str] = Field(description="Runtime -> the version whose options the package was checked against.")
    check: dict[str, bool] = Field(description="Runtime -> whether its loader accepts the checkpoint.")
    serves: dict[str, list[str]] = Field(description="Runtime -> the SMs it serves the checkpoint on (lock, ls, pull).")


class HfCheckpointSummary(OpenSummary):
    """A packaged Hugging Face checkpoint: its export's report with `serving` added."""

    kind: Literal["hf-checkpoint"] = Field("hf-checkpoint", exclude=True, description="Always `hf-checkpoint`.")
    serving: Serving = Field(description="What serving/ holds and which runtimes serve the checkpoint.")


class GgufFile(BaseModel):
    """One GGUF file as llama.cpp's reader (gguf-py's GGUFReader) sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str = Field(description="Its path in the artifact.")
    bytes: int = Field(ge=0, description="Its size in bytes.")
    architecture: str = Field(description="general.architecture: llama.cpp's name of the model's architecture.")
    file_type: int = Field(description="general.file_type: the enum llama_ftype it was written as.")
    tensors: dict[str, int] = Field(description="ggml tensor type -> how many tensors are stored in it.")
    tokenizer: str = Field(description="tokenizer.ggml.model: the tokenizer inside the file (gpt2, llama, ...).")
    vocab_size: int = Field(ge=1, description="Tokens in the file's vocabulary.")


class GgufConvertSummary(StageSummary):
    """The source as llama.cpp's converter wrote it (convert_hf_to_gguf.py)."""

    kind: Literal["gguf-convert"] = Field("gguf-convert", exclude=True, description="Always `gguf-convert`.")
    gguf: GgufFile = Field(description="The converted file.")
    outtype: str = Field(description="convert_hf_to_gguf.py's --outtype.")
    converter: str = Field(description="Which converter ran (the key's toolchain part llamacpp_converter).")


class LlamaCppServing(BaseModel):
    """serving/ of a GGUF: the llama.cpp server's command, as llama-cpp-python's own parser took it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    files: list[str] = Field(description="Files written under serving/, relative to the artifact.")
    command: list[str] = Field(description="The server's command line, run from the artifact's folder.")
    llama_cpp_python: str = Field(description="The llama-cpp-python version whose parser accepted the options.")


class GgufSummary(StageSummary):
    """A GGUF target: llama.cpp's quantizer's output and how llama.cpp serves it."""

    kind: Literal["gguf"] = Field("gguf", exclude=True, description="Always `gguf`.")
    gguf_type: str = Field(description="The llama-quantize type the recipe asked for (Q8_0, Q4_K_M, ...).")
    gguf: GgufFile = Field(description="The quantized file.")
    fallback_tensors: int = Field(ge=0, description="Tensors llama.cpp stored in a fallback type (its block does not divide their rows).")
    serving: LlamaCppServing = Field(description="How llama.cpp serves it.")


class EngineToolchainUsed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tensorrt_llm: Optional[str] = Field(description="tensorrt_llm version that built the engine.")
    tensorrt: Optional[str] = Field(description="TensorRT version that built it.")
    image: Optional[str] = Field(description="Container image it was built in (None: this host's install).")


class EngineMemory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    engine_bytes_per_rank: int = Field(ge=0, description="Bytes of the largest rank's engine file.")


class EngineSummary(StageSummary):
    """trtbuild.json beside an engine: what it was built from and what it is tied to."""

    kind: Literal["engine"] = Field("engine", description="Always `engine` (written: the file is read alone).")
    schema_: Literal[1] = Field(1, alias="schema", description="Version of trtbuild.json's layout.")
    sm: str = Field(pattern=r"^sm\d+$", description="The SM it was built for.")
    tp: int = Field(ge=1, description="Tensor parallelism.")
    pp: int = Field(ge=1, description="Pipeline parallelism.")
    world_size: int = Field(ge=1, description="GPUs it needs (tp x pp).")
    quantization: Optional[dict[str, JsonValue]] = Field(description="The checkpoint config's quantization.")
    checkpoint: str = Field(pattern=r"^[0-9a-f]{64}$", description="Digest of the checkpoint it was built from.")
    toolchain: EngineToolchainUsed = Field(description="What built it.")
    standin: bool = Field(description="Built by a stand-in toolchain (tests): never for real use.")
    command: list[str] = Field(description="The trtllm-build command line as run.")
    memory: EngineMemory = Field(description="Its size per GPU.")

    model_config = ConfigDict(populate_by_name=True)

    def platform(self, standin: Optional[bool] = None) -> EnginePlatform:
        """The engine's platform (the one model of it); `standin`: what the record knows besides
        this file (a stand-in part of the key's toolchain)."""
        return EnginePlatform(sm=self.sm, tp=self.tp, pp=self.pp, world_size=self.world_size,
                              tensorrt_llm=self.toolchain.tensorrt_llm, tensorrt=self.toolchain.tensorrt,
                              image=self.toolchain.image, quantization=self.quantization,
                              engine_bytes_per_rank=self.memory.engine_bytes_per_rank,
                              standin=self.standin if standin is None else standin)


class ReferenceSummary(StageSummary):
    """The source's reference log-probabilities on the evaluation windows."""

    kind: Literal["reference"] = Field("reference", exclude=True, description="Always `reference`.")
    text_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the evaluation text (UTF-8).")
    windows: int = Field(ge=1, description="Evaluation windows.")
    seq_len: int = Field(ge=1, description="Tokens per window.")
    top_k: int = Field(ge=1, description="Log-probabilities kept per position.")
    ppl: float = Field(description="The source's perplexity on the windows.")
    text_tokens: Optional[int] = Field(description="Tokens in the whole evaluation text.")
    overlapping: Optional[bool] = Field(description="True when the text is too short for disjoint windows.")
    device: str = Field(description="Device the reference was computed on.")


class Metrics(BaseModel):
    """A candidate against the reference (validate.metrics.Metrics.as_json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kld_mean: float = Field(description="KL divergence reference -> candidate, mean over tokens.")
    kld_p99: float = Field(description="KL divergence, 99th percentile over tokens.")
    top1_agreement: float = Field(ge=0, le=1, description="Share of tokens whose top-1 token agrees.")
    ppl_reference: float = Field(description="The reference's perplexity.")
    ppl: float = Field(description="The candidate's perplexity.")
    ppl_delta_pct: float = Field(description="Perplexity change against the reference, percent.")
    tokens: int = Field(ge=0, description="Tokens compared.")


class GateResult(BaseModel):
    """One gate as validate.gates.judge decided it when the validation ran: the stored verdict,
    which every reader shows and none recomputes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: Number = Field(description="The metric's value.")
    limit: Number = Field(description="The recipe's limit (a minimum for top1_agreement, else a maximum).")
    passed: bool = Field(description="Whether the value is within the limit.")


class ValidationSummary(StageSummary):
    """A validation's report.json: a candidate's metrics against the reference, the gates decided,
    and what computed them."""

    kind: Literal["validate"] = Field("validate", exclude=True, description="Always `validate`.")
    metrics: Metrics = Field(description="The headline metrics.")
    stderr: dict[str, float] = Field(description="Standard error over windows per metric (inf with one window).")
    gates: dict[str, GateResult] = Field(description="Gate name -> its value, limit and verdict.")
    tests: dict[str, dict[str, float]] = Field(description="Statistical tests behind the gates (top-1's two-sample test).")
    warnings: list[str] = Field(description="Why a gate may be unreliable or undecided, one per line.")
    gates_reliable: bool = Field(description="False when the evaluation windows share text with the calibration set.")
    calibration_overlap: Optional[float] = Field(description="Share of evaluation windows overlapping calibration text "
                                                             "(None: no calibration set).")
    runner: str = Field(description="What computed the candidate's logits (`torch`, `tensorrt_llm 1.2.0`, `vllm ...`).")
    device: str = Field(description="Where it ran (`cpu`, `cuda:0`).")
    windows: int = Field(ge=1, description="Evaluation windows.")
    backend: Optional[str] = Field(None, description="TensorRT-LLM: the backend (`engine`, `pytorch`).")
    logits_path: Optional[str] = Field(None, description="TensorRT-LLM, vLLM: how the log-probabilities were read.")
    reference_topk_lumped: Optional[float] = Field(None, description="Share of reference top-k tokens outside the "
                                                                     "candidate's returned top-k.")
    load_options: Optional[dict[str, JsonValue]] = Field(None, description="vLLM: the serve options it loaded with.")
    load_options_from: Optional[str] = Field(None, description="vLLM: where those options came from.")
    scoring_options: Optional[dict[str, JsonValue]] = Field(None, description="vLLM: the LLM arguments added for scoring.")


Summary = Union[SourceSummary, CalibrationSummary, QuantizeSummary, CheckpointSummary, HfExportSummary,
                HfCheckpointSummary, GgufConvertSummary, GgufSummary, EngineSummary, ReferenceSummary, ValidationSummary]

SUMMARY_MODELS: dict[str, type[StageSummary]] = {
    model.model_fields["kind"].default: model for model in Summary.__args__  # type: ignore[attr-defined]
}


def register_summary(model: type[StageSummary]) -> None:
    """Add the summary kind of a stage outside trtbuild's registry (the test kit's stages): its
    model's `kind` default names it. A kind trtbuild has is never replaced."""
    kind = model.model_fields["kind"].default
    if SUMMARY_MODELS.setdefault(kind, model) is not model:
        raise ValueError(f"summary kind {kind!r} is already {SUMMARY_MODELS[kind].__name__}")


class UnknownSummary(ValueError):
    """A summary whose kind no model describes."""


def kind_of(stage: str) -> str:
    """The summary kind of a record's stage: the registry's id up to the `:`."""
    return stage.split(":", 1)[0]


def parse_summary(stage: str, data: Any) -> Optional[StageSummary]:
    """The typed summary of a record of `stage` (its JSON `data`): None for a stage that wrote
    none; UnknownSummary for a kind no model describes; pydantic's ValidationError for a field
    missing, unknown or of the wrong type."""
    if data is None or isinstance(data, StageSummary):
        return data
    if not isinstance(data, dict):
        raise UnknownSummary(f"the summary is not an object ({type(data).__name__})")
    if not data:
        return None
    kind = kind_of(stage)
    model = SUMMARY_MODELS.get(kind)
    if model is None:
        raise UnknownSummary(f"stage {stage!r} has no summary kind (kinds: {', '.join(SUMMARY_MODELS)})")
    if data.get("kind", kind) != kind:
        raise UnknownSummary(f"the {kind} stage's summary says kind {data['kind']!r}")
    return model.model_validate({**data, "kind": kind})


def dump_summary(summary: Optional[StageSummary]) -> dict[str, Any]:
    """The summary's JSON as the stage wrote it ({} for none)."""
    return summary.model_dump(mode="json", by_alias=True) if summary is not None else {}
