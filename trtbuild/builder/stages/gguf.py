"""The gguf backend's stages: llama.cpp's own converter (gguf-convert) and quantizer (gguf), each
run as llama.cpp ships it, never re-implemented.

- convert: convert_hf_to_gguf.py of the llama.cpp that the installed llama-cpp-python was built
  from (host/llamacpp.py), on the source folder, in the recipe's dtype: one GGUF with the
  tokenizer inside, the input of every gguf variant.
- quantize: llama_model_quantize (llama.cpp's C API, what `llama-quantize` calls) with the
  variant's llama_ftype, then serving/: the llama.cpp server's command (llama-cpp-python's
  OpenAI-compatible server), its options parsed by that server's own argument parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from trtbuild.builder.stages.base import StageContext
from trtbuild.errors import TrtbuildError
from trtbuild.facts import quantformats
from trtbuild.store.summaries import GgufConvertSummary, GgufFile, GgufSummary, LlamaCppServing

MODEL_FILE = "model.gguf"
SERVING_DIR = "serving"
SERVER_FILE = f"{SERVING_DIR}/llamacpp_server.json"
SERVER_MODULE = "llama_cpp.server"
# general.name of every file: the converter would take the source folder's name, which is a store
# path (a checkout's digest) and not a fact of the model.
MODEL_NAME = "model"


def convert(ctx: StageContext) -> None:
    from trtbuild.host import llamacpp

    script = llamacpp.converter()
    out = ctx.out / MODEL_FILE
    command = [sys.executable, str(script), str(ctx.inputs["source"]), "--outfile", str(out),
               "--outtype", ctx.params["outtype"], "--model-name", MODEL_NAME]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode or not out.is_file():
        lines = [line for line in (done.stderr + done.stdout).strip().splitlines() if line.strip()]
        raise TrtbuildError(f"llama.cpp's converter ({script}) failed on the source: {lines[-1] if lines else f'exit {done.returncode}'}")
    problem = tokenizer_problem(out, ctx.inputs["source"])
    if problem:
        raise TrtbuildError(f"{out.name}: the tokenizer inside is not the source's: {problem}")
    ctx.report(GgufConvertSummary(gguf=describe(out, ctx.out), outtype=ctx.params["outtype"],
                                  converter=ctx.runtime.toolchain.get("llamacpp_converter") or str(script)))


# Texts whose ids llama.cpp must give exactly as the source's tokenizer does: spaces, accents,
# digits, newlines and tabs, CJK and an emoji (bytes outside the base vocabulary).
PROBE_TEXTS = ("Hello world, the quick brown fox jumps over the lazy dog.",
               "  Émile's café: 12,345 tokens\n\nnew line\ttab", "日本語のテキスト 🙂")
_TOKENIZE = ("import json, sys, llama_cpp\n"
             "llm = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)\n"
             "print(json.dumps([llm.tokenize(t.encode(), add_bos=False, special=False) for t in json.loads(sys.argv[2])]))")


def tokenizer_problem(gguf: Path, source: Path) -> Optional[str]:
    """Why llama.cpp's tokenizer of `gguf` is not the source folder's (None: it encodes PROBE_TEXTS
    to the same ids). llama.cpp runs in a process of its own: a vocabulary it cannot run aborts it."""
    from transformers import AutoTokenizer

    expected = [AutoTokenizer.from_pretrained(source)(text, add_special_tokens=False)["input_ids"] for text in PROBE_TEXTS]
    done = subprocess.run([sys.executable, "-c", _TOKENIZE, str(gguf), json.dumps(PROBE_TEXTS)], capture_output=True, text=True)
    if done.returncode:
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("#")]
        return f"llama.cpp cannot run it (exit {done.returncode}: {lines[-1] if lines else 'no message'})"
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for text, want, have in zip(PROBE_TEXTS, expected, got):
        if want != have:
            return f"llama.cpp encodes {text!r} as {have[:8]}..., the source's tokenizer as {want[:8]}..."
    return None


def quantize(ctx: StageContext) -> None:
    import ctypes

    import llama_cpp

    source = ctx.inputs["converted"] / MODEL_FILE
    out = ctx.out / MODEL_FILE
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ctx.params["ftype"]
    params.nthread = os.cpu_count() or 1  # rows are quantized independently: the bytes do not depend on it
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(), ctypes.byref(params))
    if status != 0 or not out.is_file():
        raise TrtbuildError(f"{source}: llama.cpp's quantizer failed ({ctx.params['gguf']}, llama_model_quantize returned {status})")
    gguf = describe(out, ctx.out)
    serving = write_serving(ctx.out, ctx.params)
    ctx.report(GgufSummary(gguf_type=ctx.params["gguf"], gguf=gguf, fallback_tensors=fallback_count(out, ctx.params["gguf"]),
                           serving=serving))


def server_command(params: dict, model: str = MODEL_FILE) -> list[str]:
    """The llama.cpp server's command for a GGUF target, run from the artifact's folder."""
    return ["python3", "-m", SERVER_MODULE, "--model", model, "--n_ctx", str(params["n_ctx"]),
            "--n_batch", str(params["n_batch"])]


def parse_server_options(argv: list[str]) -> dict:
    """`argv` (the options after `-m llama_cpp.server`) as llama-cpp-python's own server parses
    them (llama_cpp/server/__main__.py: add_args_from_model over Settings, then ModelSettings):
    an option it does not know, or a value it refuses, raises TrtbuildError naming it."""
    import argparse

    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, Settings

    parser = argparse.ArgumentParser(prog=SERVER_MODULE, exit_on_error=False, add_help=False)
    add_args_from_model(parser, Settings)
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            raise TrtbuildError(f"llama-cpp-python's server does not take {' '.join(unknown)}")
        return parse_model_from_args(ModelSettings, args).model_dump(mode="json")
    except (argparse.ArgumentError, ValueError) as exc:
        raise TrtbuildError(f"llama-cpp-python's server refuses {' '.join(argv)}: {exc}") from None


def write_serving(out: Path, params: dict) -> LlamaCppServing:
    from trtbuild.host import llamacpp

    command = server_command(params)
    parse_server_options(command[3:])
    serving = LlamaCppServing(files=[SERVER_FILE], command=command, llama_cpp_python=llamacpp.version() or "")
    (out / SERVING_DIR).mkdir(exist_ok=True)
    (out / SERVER_FILE).write_text(json.dumps(serving.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    return serving


def read_serving(folder: Path) -> Optional[LlamaCppServing]:
    path = folder / SERVER_FILE
    return LlamaCppServing.model_validate_json(path.read_text()) if path.is_file() else None


def _type_names(header) -> dict[str, str]:
    """Tensor name -> its ggml type's name (`q4_k`), as gguf-py (llama.cpp's package) names the ids."""
    from gguf import GGMLQuantizationType

    return {name: GGMLQuantizationType(type_id).name.lower() for name, type_id in header.tensor_types.items()}


def describe(path: Path, root: Path) -> GgufFile:
    """The file's header: what llama.cpp will read of it (trtbuild's header walk, which skips the
    vocabulary's contents: gguf-py's GGUFReader decodes every token, 2 s for SmolLM2's)."""
    from trtbuild.model.gguf_header import read_header

    header = read_header(path)
    tensors: dict[str, int] = {}
    for type_name in _type_names(header).values():
        tensors[type_name] = tensors.get(type_name, 0) + 1
    metadata = header.metadata
    return GgufFile(file=path.relative_to(root).as_posix(), bytes=path.stat().st_size,
                    architecture=metadata["general.architecture"], file_type=int(metadata["general.file_type"]),
                    tensors=dict(sorted(tensors.items())), tokenizer=metadata["tokenizer.ggml.model"],
                    vocab_size=metadata["tokenizer.ggml.tokens"].length)


def fallback_count(path: Path, gguf_type: str) -> int:
    """Tensors that llama.cpp stored in a fallback type: 2-D weights whose rows the type's block does
    not divide (quantformats.gguf_weight_type)."""
    from trtbuild.model.gguf_header import read_header

    main = quantformats.GGML_TYPES[quantformats.GGUF_TYPES[gguf_type].weights]
    header = read_header(path)
    types = _type_names(header)
    return sum(1 for name, dims in header.tensors.items()
               if len(dims) >= 2 and dims[0] % main.block and types[name] != main.name.lower())
