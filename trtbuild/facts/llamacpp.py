"""What llama.cpp's own tools take, read from the llama.cpp that llama-cpp-python vendors (the one
pinned by trtbuild[llamacpp]): the architectures its converter maps. Plain data: `plan` imports it.
The reader of trtbuild/data/llamacpp.json; the quantization types are in facts/quantformats.py."""

from __future__ import annotations

import json
from importlib import resources

_FACTS = json.loads(resources.files("trtbuild").joinpath("data", "llamacpp.json").read_text())

PINNED_VERSION: str = _FACTS["llama_cpp_python"]  # the llama-cpp-python trtbuild[llamacpp] installs
PINNED = f"llama-cpp-python {PINNED_VERSION}"
# The one install command for it, wherever a message names it: the extra holds the pin, and
# CMAKE_ARGS leaves out the multimodal library its compile of llama.cpp would build for nothing.
INSTALL = "CMAKE_ARGS=-DLLAVA_BUILD=OFF python3 -m pip install 'trtbuild[llamacpp]'"
CONVERTER_ARCHITECTURES: frozenset[str] = frozenset(_FACTS["converter_architectures"]["names"])
