"""Node ids: the names of targets (`fp8-tp2`, `fp8-tp2-sm90`, `fp8-hf`, `q8-gguf`) and of what the graph
derives from a target (its validations, its twin engine, its quantized weights, an hf-checkpoint's
export). Made and parsed here only; a module of its own so that reading a lock (push, pull, ls, the
report) needs no graph."""

from __future__ import annotations

import re
from typing import Optional

TARGET_STAGES = ("checkpoint", "hf-checkpoint", "engine", "gguf")  # what a lock's user pulls; the rest are internal
DERIVED = ":"  # `<target>:<what>`: a node derived from a target (a validation, a twin engine), never a target


def checkpoint_id(variant: str, tp: int, pp: int) -> str:
    """A TensorRT-LLM checkpoint target: `fp8-tp2`, `fp8-tp2-pp2` (pp only when above 1)."""
    return f"{variant}-tp{tp}" + (f"-pp{pp}" if pp > 1 else "")


def engine_id(variant: str, tp: int, pp: int, sm: str) -> str:
    """An engine target: its checkpoint's id and the SM it is built for (`fp8-tp2-sm90`)."""
    return f"{checkpoint_id(variant, tp, pp)}-{sm}"


def hf_id(variant: str) -> str:
    """A Hugging Face checkpoint target (`fp8-hf`)."""
    return f"{variant}-hf"


def gguf_id(variant: str) -> str:
    """A GGUF target, llama.cpp's file of a gguf variant (`q8-gguf`)."""
    return f"{variant}-gguf"


GGUF_CONVERTED = "gguf-source"  # the source as llama.cpp's converter writes it, unquantized: every gguf variant's input

_TARGET = re.compile(r"^(?P<variant>.+?)(?:-tp\d+(?:-pp\d+)?(?:-(?P<sm>sm\d+))?|-hf|-gguf)$")


def variant_of(target_id: str) -> Optional[str]:
    """The variant in a target's id (checkpoint_id, engine_id, hf_id, gguf_id); None for any other id."""
    match = _TARGET.match(target_id)
    return match.group("variant") if match and DERIVED not in target_id else None


def checkpoint_of_engine(engine: str, sm: str) -> str:
    """The checkpoint an engine target was built from (`fp8-tp2-sm90`, sm90 -> `fp8-tp2`)."""
    return engine.removesuffix(f"-{sm}")


def is_target(node_id: str, stage: str) -> bool:
    """A target (what a lock's user pulls), not a node derived from one: an engine twin has an
    engine's stage and `:twin` in its id."""
    return stage in TARGET_STAGES and DERIVED not in node_id


def validate_id(target: str) -> str:
    """The torch validation of a checkpoint, or the TensorRT-LLM validation of an engine."""
    return f"{target}:validate"


def trtllm_validate_id(target: str) -> str:
    """An hf-checkpoint's validation as TensorRT-LLM's PyTorch backend serves it."""
    return f"{target}:validate-trtllm"


def vllm_validate_id(target: str) -> str:
    """An hf-checkpoint's validation as vLLM loads it."""
    return f"{target}:validate-vllm"


def twin_id(engine: str) -> str:
    """The engine built with --gather_context_logits only to be validated."""
    return f"{engine}:twin"


def quantized_id(variant: str) -> str:
    return f"{variant}-quantized"


def hf_export_id(target: str) -> str:
    """The weights of an hf-checkpoint target (`fp8-hf` -> `fp8-hf-export`): the target itself is
    these files plus serving/ (the runtime options), so a change of limits re-packages, not re-exports."""
    return f"{target}-export"
