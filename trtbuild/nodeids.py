"""Node ids: how the graph names what it derives from a target (its validations, its twin engine,
its quantized weights, an hf-checkpoint's export). Made and parsed here only; a module of its own
so that reading a lock (push, pull, ls, the report) needs no graph."""

from __future__ import annotations


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
