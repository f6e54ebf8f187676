"""vLLM 0.33.0's request errors, as vllm/exceptions.py of the PyPI wheel
vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl (sha256 4b6bdec4...da883aa) defines them:
`VLLMValidationError(VLLMClientError(VLLMError(Exception)))`, whose str() appends
`(parameter=..., value=...)`. (vLLM 0.26.0 derives VLLMValidationError from ValueError instead,
with the same str(): vllm/exceptions.py of vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl.)"""

from __future__ import annotations

from typing import Any, Optional


class VLLMError(Exception):
    pass


class VLLMClientError(VLLMError):
    pass


class VLLMValidationError(VLLMClientError):
    def __init__(self, message: str, *, parameter: Optional[str] = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        extras = [f"{name}={v}" for name, v in (("parameter", self.parameter), ("value", self.value)) if v is not None]
        base = super().__str__()
        return f"{base} ({', '.join(extras)})" if extras else base
