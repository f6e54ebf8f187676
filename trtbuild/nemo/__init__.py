"""NeMo checkpoints (.nemo, NeMo 2 folders) to Hugging Face LLaMA folders, without nemo or megatron."""

from trtbuild.nemo.convert import convert

__all__ = ["convert"]
