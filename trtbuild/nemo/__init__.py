"""NeMo checkpoints (.nemo, NeMo 2 folders) to Hugging Face LLaMA folders, without nemo or megatron."""

from __future__ import annotations


def __getattr__(name: str):
    # Lazy: planning reads nemo.config (YAML only); convert brings torch, which `plan` never imports.
    if name == "convert":
        from trtbuild.nemo.convert import convert

        globals()["convert"] = convert  # importing the submodule bound its name to the module: rebind
        return convert
    raise AttributeError(f"module 'trtbuild.nemo' has no attribute {name!r}")


__all__ = ["convert"]
