"""`trtbuild check DIR`: an engine folder against this host (engine_check), a Hugging Face
checkpoint against the runtimes' loader rules (serving/check.py), or a GGUF artifact against this
host's llama.cpp (gguf_check), whichever DIR is."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from trtbuild.errors import InvalidInput


@dataclass
class Checked:
    result: Any  # engine_check.CheckResult, serving.check.ServingCheck or gguf_check.GgufCheck: as_json() and lines()
    exit_code: int  # 0 fits / accepted, 1 not

    def as_json(self) -> dict:
        return self.result.as_json()

    def lines(self) -> list[str]:
        return self.result.lines()


def check_folder(folder: Path, lock_path: Optional[Path] = None, runtimes: Sequence[str] = (),
                 gpus: Sequence[str] = ()) -> Checked:
    """`runtimes` and `gpus` (none: every runtime, at least one SM) apply to a checkpoint, `lock_path`
    to an engine (its engine targets that would fit); either given for another kind is one line. A
    GGUF artifact takes neither: llama.cpp on this host is what it is checked against."""
    from trtbuild.deploy.engine_check import check, is_hf_checkpoint
    from trtbuild.deploy.gguf_check import check_gguf, is_gguf_folder

    if is_gguf_folder(folder):
        given = [option for option, value in (("--lock", lock_path), ("--runtime", runtimes), ("--gpu", gpus)) if value]
        if given:
            raise InvalidInput(f"{given[0]} does not apply to a GGUF folder ({folder}): it is checked against this "
                               "host's llama.cpp")
        gguf = check_gguf(folder)
        return Checked(gguf, gguf.exit_code)
    if is_hf_checkpoint(folder):
        from trtbuild.serving.check import RUNTIMES, check_checkpoint

        if lock_path is not None:
            raise InvalidInput(f"--lock applies to an engine folder; {folder} is a Hugging Face checkpoint")
        hf = check_checkpoint(folder, list(runtimes) or RUNTIMES, list(gpus) or None)
        return Checked(hf, 0 if hf.accepted else 1)
    if runtimes or gpus:
        option = "--runtime" if runtimes else "--gpu"
        raise InvalidInput(f"{option} applies to a Hugging Face checkpoint folder; {folder} is not one")
    result = check(folder, lock_path)
    return Checked(result, result.exit_code)
