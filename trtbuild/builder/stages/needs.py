"""What a stage needs of the host it runs on (a GPU, a CUDA device, tensorrt_llm, vLLM), and the
texts whose content is a key input: declared here, next to the stages that have the need, and
handed to the graph by the registry (registry.host_need). Each need is a small frozen record
that checks this host (`problem()`); the probes it makes are the stage's own (checkpoint.quantize,
validate.trtllm_runner, validate.vllm_runner, host.toolchain)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trtbuild.host import hardware, toolchain


class HostNeed:
    """What a node needs of the host it runs on, as data; `problem()` checks this host."""

    def problem(self) -> Optional[str]:
        raise NotImplementedError


@dataclass(frozen=True)
class CalibrationDevice(HostNeed):
    """A CUDA device asked for, or a format that ModelOpt calibrates only on CUDA (quantize.needs_cuda)."""

    quant: Optional[str]
    kv_cache: Optional[str]
    device: str

    def problem(self) -> Optional[str]:
        resolved = hardware.resolve_device(self.device)
        if self.device == "cuda" and resolved != "cuda":
            return "needs a CUDA GPU (calibration.device: cuda); this machine has none"
        if resolved == "cpu":
            from trtbuild.checkpoint.quantize import needs_cuda

            reason = needs_cuda(self.quant, self.kv_cache)
            return f"needs a CUDA GPU: {reason}" if reason else None
        return None


@dataclass(frozen=True)
class EngineHost(HostNeed):
    """A GPU of the engine's SM, and tensorrt_llm of the recipe's line here (or docker, to build in
    the recipe's image)."""

    sm: str
    tensorrt_llm: str
    image: Optional[str] = None

    def problem(self) -> Optional[str]:
        if self.image:
            return toolchain.container_host_problem(self.sm, self.image)
        return toolchain.engine_host_problem(self.sm, self.tensorrt_llm)


@dataclass(frozen=True)
class TrtllmRunner(HostNeed):
    """TensorRT-LLM's LLM API for `backend` on a GPU (validate:trtllm)."""

    backend: str
    series: str

    def problem(self) -> Optional[str]:
        from trtbuild.validate import trtllm_runner

        return trtllm_runner.available(self.backend, self.series)


@dataclass(frozen=True)
class VllmRunner(HostNeed):
    """vLLM on a GPU that it serves the variant's format on (validate:vllm)."""

    quant: Optional[str]
    kv_cache: Optional[str]

    def problem(self) -> Optional[str]:
        from trtbuild.validate import vllm_runner

        return vllm_runner.available(self.quant, self.kv_cache)


@dataclass(frozen=True)
class TextInput:
    """A key input that is the content of a text (calibration or evaluation set), digested at key
    time: moving or renaming the file changes nothing."""

    purpose: str  # calibration | evaluation
    spec: str  # `builtin`, a file or a folder
    base_dir: str

    def digest(self, state=None) -> str:
        """The text's sha256; `state`: the store's stat cache (it keeps the builtin evaluation text's)."""
        if self.purpose == "calibration":
            from trtbuild.checkpoint.calibration import text_digest

            return text_digest(self.spec, Path(self.base_dir))
        from trtbuild.validate.evaltext import eval_text_digest

        return eval_text_digest(self.spec, Path(self.base_dir), state)
