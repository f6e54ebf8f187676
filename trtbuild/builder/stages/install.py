"""What to install for the packages a stage needs and this install lacks: the exact pip command."""

from __future__ import annotations

# README's set-up installs this torch before trtbuild[quantize], so that pip takes its CPU build
# rather than a multi-GB CUDA one (tests/test_cli.py checks the README still says so).
CPU_TORCH = "torch==2.13.0"
EXTRA_OF = {"tensorrt_llm": "trtllm", "vllm": "vllm", "llama_cpp": "llamacpp"}  # every other package a stage needs comes with trtbuild[quantize]


def extra_for(package: str) -> str:
    return EXTRA_OF.get(package, "quantize")


def install_hint(absent: list[str]) -> str:
    """`needs torch, transformers: install them with `...``: the exact command for what is missing."""
    commands = []
    for extra in sorted({extra_for(p) for p in absent}):
        if extra == "quantize":
            commands.append(f"`python3 -m pip install {CPU_TORCH} 'trtbuild[quantize]'` "
                            "(torch first, so that pip takes its CPU build)")
        elif extra == "llamacpp":
            from trtbuild.facts.llamacpp import INSTALL

            commands.append(f"`{INSTALL}` (it compiles llama.cpp: about 3.5 minutes on 2 cores)")
        else:
            commands.append(f"`python3 -m pip install 'trtbuild[{extra}]'` on a GPU host")
    pronoun = "it" if len(absent) == 1 else "them"
    return f"needs {', '.join(absent)}: install {pronoun} with {' and '.join(commands)}, or use the container image"
