"""What llama.cpp's own tools take, read from the llama.cpp that llama-cpp-python vendors (the one
pinned by trtbuild[llamacpp]): the architectures its converter maps. Plain data: `plan` imports it.
The reader of trtbuild/data/llamacpp.json; the quantization types are in facts/quantformats.py."""

from __future__ import annotations

import json
from importlib import resources

_FACTS = json.loads(resources.files("trtbuild").joinpath("data", "llamacpp.json").read_text())

PINNED_VERSION: str = _FACTS["llama_cpp_python"]  # the llama-cpp-python trtbuild[llamacpp] installs
PINNED = f"llama-cpp-python {PINNED_VERSION}"
CONVERTER_ARCHITECTURES: frozenset[str] = frozenset(_FACTS["converter_architectures"]["names"])
