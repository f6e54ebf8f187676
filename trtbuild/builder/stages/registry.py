"""The stages trtbuild has, by node kind. A kind without a stage yet is reported `skipped`."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from trtbuild.builder.stages import needs
from trtbuild.builder.stages.base import Stage

STAGES: dict[str, Optional[Stage]] = {
    "source:path": Stage("source", 1, "trtbuild.builder.stages.source.local:adopt_folder", isolated=False),
    # 2: the tokenizer the GGUF encodes, no longer a copy of the GGUF as tokenizer.model
    # 3: a byte-level BPE tokenizer (tokenizer.ggml.model gpt2) written as one, not as transformers'
    # LlamaTokenizer with byte fallback (llama.cpp's converter took that for SentencePiece)
    "source:gguf": Stage("source", 4, "trtbuild.builder.stages.source.gguf:convert_gguf",
                         toolchain=("torch", "transformers", "gguf"), needs=("torch", "transformers", "gguf", "accelerate")),
    # Later stages land with their issues; until then their nodes are skipped with this reason.
    "source:hf": Stage("source", 1, "trtbuild.builder.stages.source.hf:download", isolated=False),
    "source:nemo": Stage("source", 1, "trtbuild.builder.stages.source.nemo:convert_nemo",
                         toolchain=("torch", "safetensors"), needs=("torch", "safetensors")),
    "source:s3": Stage("source", 1, "trtbuild.builder.stages.source.s3:fetch_folder", isolated=False),
    "calibration": Stage("calibration", 1, "trtbuild.builder.stages.checkpoint:make_windows",
                         toolchain=("transformers",), needs=("transformers",)),
    "quantize": Stage("quantize", 2, "trtbuild.builder.stages.checkpoint:quantize",
                      toolchain=("torch", "transformers", "modelopt", "cuda"), needs=("torch", "transformers", "modelopt")),
    # 2: writes the float W8A16 checkpoint of int8_wo (TensorRT-LLM quantizes it at load) from the
    # variant's `quant`, which version 1 ignored; its report names the quant_algo
    "checkpoint:convert": Stage("checkpoint", 2, "trtbuild.builder.stages.checkpoint:convert_checkpoint",
                                toolchain=("safetensors",), needs=("torch", "safetensors")),
    "checkpoint:export": Stage("checkpoint", 1, "trtbuild.builder.stages.checkpoint:export_checkpoint",
                               toolchain=("torch", "transformers", "modelopt"), needs=("torch", "transformers", "modelopt")),
    # A Hugging Face checkpoint: the weights (hf-export), then the target (hf-checkpoint:package),
    # the export's files overlaid with serving/ (runtime options, loader check): no torch, no copy.
    "hf-export:convert": Stage("hf-export", 1, "trtbuild.builder.stages.checkpoint:convert_hf",
                               toolchain=("safetensors",), needs=("torch", "safetensors")),
    # 2: an AWQ export's config.json quantization_config carries the group_size too (as hf_quant_config.json)
    "hf-export:export": Stage("hf-export", 2, "trtbuild.builder.stages.checkpoint:export_hf",
                              toolchain=("torch", "transformers", "modelopt"), needs=("torch", "transformers", "modelopt")),
    "hf-checkpoint:package": Stage("hf-checkpoint", 1, "trtbuild.builder.stages.package:package_hf", isolated=False,
                                   overlay="weights"),
    # trtllm-build here (tensorrt_llm installed in this environment, its scripts on PATH), or in the
    # recipe's container image (toolchain.image: only docker needed here; the key names the image).
    # llama.cpp's own converter (the sdist of the installed llama-cpp-python: host/llamacpp.py) and
    # quantizer (llama_model_quantize in its library), then the file as llama.cpp computes it.
    "gguf-convert": Stage("gguf-convert", 1, "trtbuild.builder.stages.gguf:convert",
                          toolchain=("llama_cpp", "llamacpp_converter", "torch", "transformers", "numpy"),
                          needs=("llama_cpp", "torch", "transformers")),
    "gguf": Stage("gguf", 1, "trtbuild.builder.stages.gguf:quantize", toolchain=("llama_cpp",), needs=("llama_cpp",)),
    "validate:llamacpp": Stage("validate", 1, "trtbuild.builder.stages.validate:validate_llamacpp",
                               toolchain=("llama_cpp",), needs=("llama_cpp",)),
    "engine": Stage("engine", 1, "trtbuild.builder.stages.engine:build_engine", toolchain=("tensorrt_llm", "tensorrt"),
                    needs=("tensorrt_llm",), timing_cache=True),
    "engine:image": Stage("engine", 1, "trtbuild.builder.stages.engine:build_engine", toolchain=("image",), timing_cache=True),
    "reference": Stage("reference", 1, "trtbuild.builder.stages.validate:make_reference",
                       toolchain=("torch", "transformers"), needs=("torch", "transformers")),
    # 2: a checkpoint read back for validation keeps the rotary inv_freq in float32 (version 1's
    # reports made on a GPU, in bfloat16, measured a model with a degraded RoPE)
    "validate": Stage("validate", 2, "trtbuild.builder.stages.validate:validate",
                      toolchain=("torch", "transformers", "modelopt"), needs=("torch", "transformers", "modelopt")),
    # Engines and hf-checkpoints as TensorRT-LLM serves them; the node's `requires` says why a host
    # cannot (trtllm_runner.available) before the needs are checked. 2: a stand-in's report says
    # `cpu`, where version 1 named cuda:0 for what the stand-in computed on the CPU.
    "validate:trtllm": Stage("validate", 2, "trtbuild.builder.stages.validate:validate_trtllm",
                             toolchain=("tensorrt_llm", "tensorrt", "cuda"), needs=("tensorrt_llm",)),
    # A packaged hf-checkpoint as vLLM loads it (its serving/vllm_args.json); the node's host need
    # (vllm_runner.available) says why a host cannot before the needs are checked.
    # 2: the LLM made with max_logprobs (vLLM refused version 1's prompt_logprobs=256); the report's
    # device is what vLLM's engine config says (cpu on a CPU platform, CUDA devices by rank; version 1
    # wrote cuda:N whatever ran) and names scoring_options
    "validate:vllm": Stage("validate", 2, "trtbuild.builder.stages.validate:validate_vllm",
                           toolchain=("vllm", "torch", "cuda"), needs=("vllm",)),
}

# The torch stages run one after another in the build's shared worker (worker_pool.py): a variant
# pays the imports and the model load once. Engines and TensorRT-LLM or vLLM validation keep a
# process of their own, which frees the GPU memory they take when they end.
SHARE_A_WORKER = frozenset({"source:gguf", "source:nemo", "calibration", "quantize", "checkpoint:convert",
                            "checkpoint:export", "hf-export:convert", "hf-export:export", "reference", "validate",
                            # its converter and llama.cpp's tokenizer probe run in processes of their own;
                            # in the worker, the probe's transformers is imported already
                            "gguf-convert"})

# Each stage knows its registry name: the lock file records the toolchain per stage id.
STAGES = {kind: (replace(stage, id=kind, shares_worker=kind in SHARE_A_WORKER) if stage else None)
          for kind, stage in STAGES.items()}

NOT_YET = "this version of trtbuild has no {kind} stage yet"

# What the stages of a kind need of a host (stages/needs.py): the graph asks here, with the facts
# of the node (its formats, device, SM, pinned toolchain line), and the runner checks the need.
HOST_NEEDS: dict[str, type[needs.HostNeed]] = {
    "quantize": needs.CalibrationDevice,  # a CUDA device, for what ModelOpt calibrates only there
    "engine": needs.EngineHost,  # a GPU of the SM, tensorrt_llm of the recipe's line (or docker for its image)
    "validate:trtllm": needs.TrtllmRunner,  # TensorRT-LLM's LLM API for the backend, on a GPU
    "validate:vllm": needs.VllmRunner,  # vLLM on a GPU it serves the format on
}


def host_need(kind: str, *facts) -> needs.HostNeed:
    """What a node of `kind` needs of the host it runs on, made from the node's facts."""
    return HOST_NEEDS[kind](*facts)


def text_input(purpose: str, spec: str, base_dir: str) -> needs.TextInput:
    """A calibration or evaluation text whose content (not its path) is a key input."""
    return needs.TextInput(purpose, spec, base_dir)
