"""`trtbuild check DIR` on a GGUF artifact (a gguf target's folder: model.gguf, report.json and
serving/llamacpp_server.json): whether this host's llama.cpp loads the file, with which
llama-cpp-python, what the file is (report.json: its type and architecture, against what llama.cpp
reads of it), and whether the packaged server options parse with this host's llama-cpp-python
server parser (builder/stages/gguf.parse_server_options, the parser the build used).

llama.cpp loads the file in a process of its own: on a file it cannot run it may abort (it asserts
rather than raises), and that must not take trtbuild with it. It decodes one short prompt, so the
weights are used, not only mapped."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from trtbuild.builder.stages.gguf import MODEL_FILE, SERVER_FILE, parse_server_options, read_serving
from trtbuild.deploy.select import LLAMACPP_INSTALL
from trtbuild.errors import TrtbuildError
from trtbuild.host import llamacpp
from trtbuild.store.summaries import GgufSummary

REPORT_FILE = "report.json"
# Tokens of context the check loads with: enough for its probe; the packaged n_ctx's KV cache is the
# server's to size, and a small one keeps the check quick for a model of any size.
LOAD_CONTEXT = 64
LOAD_TIMEOUT_S = 600
# verbose=True: llama.cpp's own log goes to stderr, where its reason for refusing a file is.
_LOAD = ("import json, sys, llama_cpp\n"
         "n_ctx = int(sys.argv[2])\n"
         "llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=n_ctx, n_batch=n_ctx, n_threads=1, verbose=True)\n"
         "llm.eval(llm.tokenize(b'Hello', add_bos=True))\n"
         "print(json.dumps({'architecture': llm.metadata.get('general.architecture'), 'vocab_size': llm.n_vocab()}))")
_CAUSE = re.compile(r"error|invalid|failed|corrupt", re.IGNORECASE)
_LOG_PREFIX = re.compile(r"^(?:[a-z_]+: )+")  # llama.cpp's `function_name: ` before each log line


def is_gguf_folder(folder: Path) -> bool:
    """A gguf target's folder: its model.gguf is what makes it one."""
    return (folder / MODEL_FILE).is_file()


@dataclass
class GgufCheck:
    folder: Path
    llama_cpp_python: Optional[str]  # this host's (package metadata); None: not installed
    report: Optional[GgufSummary]  # the folder's report.json; None when missing or unreadable
    loaded: Optional[dict[str, Any]] = None  # what llama.cpp read of the file it loaded; None: it did not
    command: Optional[list[str]] = None  # the packaged server command
    packaged_with: Optional[str] = None  # the llama-cpp-python whose parser took it at build time
    options_parse: bool = False  # this host's server parser accepts the packaged options
    problems: list[str] = field(default_factory=list)  # one line each, naming the file

    @property
    def model(self) -> Path:
        return self.folder / MODEL_FILE

    @property
    def accepted(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        return 0 if self.accepted else 1

    def lines(self) -> list[str]:
        if not self.accepted:
            return list(self.problems)
        g = self.report.gguf
        return [f"OK: {self.model} loads in llama.cpp (llama-cpp-python {self.llama_cpp_python}): "
                f"{self.report.gguf_type} (file type {g.file_type}), {g.architecture}, {g.vocab_size} tokens",
                f"server: `{' '.join(self.command)}` (run from {self.folder}): its options parse with "
                f"llama-cpp-python {self.llama_cpp_python}'s server (packaged with {self.packaged_with})"]

    def as_json(self) -> dict[str, Any]:
        r = self.report
        return {"gguf_dir": str(self.folder), "file": str(self.model), "accepted": self.accepted,
                "loads": self.loaded is not None, "llama_cpp_python": self.llama_cpp_python,
                "report": None if r is None else {"gguf_type": r.gguf_type, "architecture": r.gguf.architecture,
                                                  "file_type": r.gguf.file_type, "bytes": r.gguf.bytes,
                                                  "vocab_size": r.gguf.vocab_size},
                "loaded": self.loaded,
                "server": None if self.command is None else {"command": self.command, "packaged_with": self.packaged_with,
                                                             "options_parse": self.options_parse},
                "problems": self.problems}


def check_gguf(folder: Path) -> GgufCheck:
    result = GgufCheck(folder, llamacpp.version(), _read_report(folder))
    problems = result.problems
    model = result.model
    if result.report is None:
        problems.append(f"{folder / REPORT_FILE}: not found or not a gguf target's report (its type and architecture)")
    elif model.stat().st_size != result.report.gguf.bytes:
        problems.append(f"{model}: {model.stat().st_size} bytes; {REPORT_FILE} records {result.report.gguf.bytes}")
    if result.llama_cpp_python is None:
        problems.append(f"{model}: not checked: this host has no llama-cpp-python ({LLAMACPP_INSTALL})")
        return result
    _check_load(result)
    _check_server(result)
    return result


def _read_report(folder: Path) -> Optional[GgufSummary]:
    try:
        return GgufSummary.model_validate_json((folder / REPORT_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValidationError):
        return None


def _check_load(result: GgufCheck) -> None:
    model, label = result.model, f"llama.cpp (llama-cpp-python {result.llama_cpp_python})"
    try:
        done = subprocess.run([sys.executable, "-c", _LOAD, str(model), str(LOAD_CONTEXT)], capture_output=True,
                              text=True, timeout=LOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        result.problems.append(f"{model}: {label} did not load it within {LOAD_TIMEOUT_S} s")
        return
    if done.returncode:
        result.problems.append(f"{model}: {label} cannot load it: {load_failure(done.stderr, done.returncode)}")
        return
    result.loaded = json.loads(done.stdout.strip().splitlines()[-1])
    report = result.report
    if report is not None:  # the file llama.cpp read is the one the report describes
        for name, reported in (("architecture", report.gguf.architecture), ("vocab_size", report.gguf.vocab_size)):
            if result.loaded[name] != reported:
                result.problems.append(f"{model}: llama.cpp reads {name} {result.loaded[name]}; {REPORT_FILE} "
                                       f"records {reported}")


def load_failure(stderr: str, returncode: int) -> str:
    """llama.cpp's reason, from its log: the first line that says what is wrong (the root cause;
    later ones say only that loading failed), without its function-name prefixes; else how the
    process ended."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    tail = lines.index("Traceback (most recent call last):") if "Traceback (most recent call last):" in lines else len(lines)
    cause = next((line for line in lines[:tail] if _CAUSE.search(line)), None)
    if cause is not None:
        return _LOG_PREFIX.sub("", cause).removeprefix("error loading model: ")
    if returncode < 0:
        return f"llama.cpp died of {signal.Signals(-returncode).name}"
    return lines[-1] if lines else f"exit {returncode}"


def _check_server(result: GgufCheck) -> None:
    where = result.folder / SERVER_FILE
    try:
        serving = read_serving(result.folder)
    except (ValidationError, ValueError):
        serving = None
    if serving is None:
        result.problems.append(f"{where}: not found or not the llama.cpp server's command")
        return
    result.command, result.packaged_with = list(serving.command), serving.llama_cpp_python
    try:
        options = parse_server_options(serving.command[3:])
    except ImportError as exc:
        result.problems.append(f"{where}: not checked: llama-cpp-python's server is not installed ({exc}; "
                               f"{LLAMACPP_INSTALL})")
        return
    except TrtbuildError as exc:
        result.problems.append(f"{where}: {exc}")
        return
    result.options_parse = True
    if not (result.folder / options["model"]).is_file():  # the command runs from the folder
        result.problems.append(f"{where}: --model {options['model']} is not a file of {result.folder}")
