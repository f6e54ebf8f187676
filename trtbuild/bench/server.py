"""An artifact's runtime server for a measurement: started from the options the artifact packages
(serving/), on a free loopback port, in a process group of its own; ready when GET /v1/models
answers 200; its peak memory sampled while it runs; and the whole group ended (SIGTERM, then
SIGKILL) however the block is left: an error, the load generator failing, Ctrl-C.

    with RuntimeServer(spec, ready_timeout_s) as server:   # spawned and ready
        server.url, server.time_to_ready_s                  # http://127.0.0.1:PORT, seconds from spawn
        ...                                                 # drive the load
    server.peak_rss_mib, server.peak_gpu_memory_mib          # over the server's whole life
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from trtbuild.errors import TrtbuildError
from trtbuild.facts.runtime_names import BENCH_RUNTIMES

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 10.0
SAMPLE_INTERVAL_S = 0.2
LOG_TAIL_LINES = 5
RUNTIMES = BENCH_RUNTIMES


@dataclass(frozen=True)
class ServerSpec:
    """How to start one runtime on one artifact: the argv without host and port, where to run it,
    and how many GPUs it takes (its tensor times pipeline parallel size; 0 on the CPU)."""

    runtime: str
    artifact: str  # how messages name it: the target and its digest
    folder: Path
    argv: tuple[str, ...]
    gpus: int
    env: dict[str, str] = field(default_factory=dict)  # overrides (VLLM_CACHE_ROOT, TLLM_AUTOTUNER_CACHE_PATH)


def _serving_file(folder: Path, name: str) -> Optional[Path]:
    """serving/NAME, or None. A recipe with several parallelism entries writes serving/tpN/NAME each:
    which one to serve is a choice this command does not make for the user."""
    from trtbuild.serving.options import SERVING_DIR

    path = folder / SERVING_DIR / name
    if path.is_file():
        return path
    several = sorted(p.parent.name for p in (folder / SERVING_DIR).glob(f"*/{name}"))
    if several:
        raise TrtbuildError(f"{folder / SERVING_DIR}: options for several parallelism entries ({', '.join(several)}); "
                            "bench serves an artifact with one")
    return None


def _flags(path: Path) -> list[str]:
    """A serving/*_args.json object (flag -> value) as argv."""
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise TrtbuildError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TrtbuildError(f"{path}: expected a JSON object of flags, got {type(data).__name__}")
    argv: list[str] = []
    for flag, value in data.items():
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def _int_flag(argv: list[str], *names: str) -> int:
    for name in names:
        if name in argv[:-1]:
            return int(argv[argv.index(name) + 1])
    return 1


def server_spec(runtime: str, folder: Path, artifact: str, env: Optional[dict[str, str]] = None) -> ServerSpec:
    """The start command of `runtime` on the artifact in `folder`, from its packaged options (one
    line when the artifact has none for that runtime)."""
    from trtbuild.serving.options import LLM_API_OPTIONS_FILE, SGLANG_ARGS_FILE, VLLM_ARGS_FILE

    env = dict(env or {})
    if runtime == "llamacpp":
        from trtbuild.builder.stages.gguf import SERVER_FILE, read_serving

        serving = read_serving(folder)
        if serving is None:
            raise TrtbuildError(f"{folder / SERVER_FILE}: not found; llamacpp serves a gguf artifact by its packaged "
                                "command")
        argv = list(serving.command)
        # the packaged command names `python3`; this interpreter is the one trtbuild (and, with the
        # llamacpp extra, llama-cpp-python) is installed in, whatever PATH's python3 is
        if argv[0] == "python3":
            argv[0] = sys.executable
        # llama-cpp-python's server cuts the answer in progress short when another request arrives
        # (interrupt_requests defaults to True): under a concurrency above 1 every answer but the
        # last would end early, and the figures would measure that
        argv += ["--interrupt_requests", "False"]
        return ServerSpec(runtime, artifact, folder, tuple(argv), 0, env)
    if runtime == "vllm":
        path = _serving_file(folder, VLLM_ARGS_FILE)
        flags = _flags(path) if path else []
        gpus = _int_flag(flags, "--tensor-parallel-size") * _int_flag(flags, "--pipeline-parallel-size")  # as packaged
        return ServerSpec(runtime, artifact, folder, ("vllm", "serve", str(folder), *flags), gpus, env)
    if runtime == "sglang":
        path = _serving_file(folder, SGLANG_ARGS_FILE)
        flags = _flags(path) if path else []
        gpus = _int_flag(flags, "--tp-size", "--tp") * _int_flag(flags, "--pp-size", "--pp")
        return ServerSpec(runtime, artifact, folder,
                          (sys.executable, "-m", "sglang.launch_server", "--model-path", str(folder), *flags), gpus, env)
    if runtime == "trtllm":
        path = _serving_file(folder, LLM_API_OPTIONS_FILE)
        argv = ["trtllm-serve", str(folder)]
        gpus = 1
        if path is not None:
            argv += ["--extra_llm_api_options", str(path)]
            options = yaml.safe_load(path.read_text()) or {}
            gpus = int(options.get("tensor_parallel_size", 1)) * int(options.get("pipeline_parallel_size", 1))
        return ServerSpec(runtime, artifact, folder, tuple(argv), gpus, env)
    raise TrtbuildError(f"--runtime {runtime}: not a runtime bench starts ({', '.join(RUNTIMES)})")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (signal 0 checks without sending)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _visible_gpus(count: int) -> list[int]:
    """NVML indices of the GPUs the server uses: the first `count` of CUDA_VISIBLE_DEVICES (when it
    lists indices), else of all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        indices = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        if indices:
            return indices[:count]
    return list(range(count))


class _Sampler(threading.Thread):
    """Peak RSS of the server's process tree (psutil) and peak GPU memory used on its GPUs (NVML),
    sampled every SAMPLE_INTERVAL_S until stopped."""

    def __init__(self, pid: int, gpus: list[int]) -> None:
        super().__init__(name="trtbuild-bench-sampler", daemon=True)
        self.pid, self.gpus = pid, gpus
        self.peak_rss = 0
        self.peak_gpu: Optional[int] = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        import psutil

        nvml = handles = None
        if self.gpus:
            try:
                import pynvml

                pynvml.nvmlInit()
                nvml, handles = pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpus]
            except Exception:  # no driver, no pynvml: the record says None, not a guess
                nvml = handles = None
        try:
            while not self._stop_event.is_set():
                self._sample(psutil, nvml, handles)
                self._stop_event.wait(SAMPLE_INTERVAL_S)
        finally:
            if nvml is not None:
                nvml.nvmlShutdown()

    def _sample(self, psutil, nvml, handles) -> None:
        try:
            root = psutil.Process(self.pid)
            rss = 0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    rss += proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak_rss = max(self.peak_rss, rss)
        except psutil.NoSuchProcess:
            pass
        if handles:
            used = sum(int(nvml.nvmlDeviceGetMemoryInfo(h).used) for h in handles)
            self.peak_gpu = used if self.peak_gpu is None else max(self.peak_gpu, used)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


class RuntimeServer:
    def __init__(self, spec: ServerSpec, ready_timeout_s: float) -> None:
        self.spec = spec
        self.ready_timeout_s = ready_timeout_s
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.command = [*spec.argv, "--host", HOST, "--port", str(self.port)]
        self.process: Optional[subprocess.Popen] = None
        self.time_to_ready_s: Optional[float] = None
        self.model: Optional[str] = None  # the served model's name, as GET /v1/models gives it
        self.peak_rss_mib: Optional[float] = None
        self.peak_gpu_memory_mib: Optional[float] = None
        self._sampler: Optional[_Sampler] = None
        self._log_dir: Optional[str] = None

    @property
    def pid(self) -> Optional[int]:
        """The server's pid, which is its process group's id."""
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return Path(self._log_dir) / "server.log"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        kept = [line.strip() for line in text.splitlines() if line.strip()]
        # a server that refuses its options prints the error and then its whole usage text: the
        # error, not the usage's end, is what the user needs
        errors = [i for i, line in enumerate(kept) if re.search(r"\berror\b|Error:", line, re.IGNORECASE)]
        start = errors[-1] if errors and len(kept) - errors[-1] > lines else max(0, len(kept) - lines)
        return " | ".join(kept[start:start + lines])

    def peaks(self) -> tuple[float, Optional[float]]:
        """(peak RSS MiB, peak GPU memory MiB or None) from the server's start until now: its start-up
        and every run so far (a measurement's record is made as its run ends, the server still up)."""
        sampler = self._sampler
        if sampler is None:
            return self.peak_rss_mib or 0.0, self.peak_gpu_memory_mib
        return sampler.peak_rss / 2**20, (sampler.peak_gpu / 2**20 if sampler.peak_gpu is not None else None)

    def __enter__(self) -> "RuntimeServer":
        from trtbuild import interrupt

        try:
            # Ctrl-C held from the folder's making to the process's start: an interrupt then never
            # falls between a spawned server and the guard that ends it
            with interrupt.held():
                self._log_dir = tempfile.mkdtemp(prefix="trtbuild-bench-")
                started = time.monotonic()
                log = open(self.log_path, "wb")
                try:
                    # a session of its own: its pid is the group's id, and ending the group ends
                    # whatever the runtime started (vLLM's engine core, TP workers)
                    self.process = subprocess.Popen(self.command, cwd=self.spec.folder, stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True, env={**os.environ, **self.spec.env})
                except OSError as exc:
                    raise TrtbuildError(f"{self.spec.runtime} server for {self.spec.artifact} could not start: "
                                        f"{exc.strerror or exc}: {self.command[0]}") from None
                finally:
                    log.close()
                self._sampler = _Sampler(self.process.pid, _visible_gpus(self.spec.gpus))
                self._sampler.start()
            self._wait_ready(started)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _wait_ready(self, started: float) -> None:
        from trtbuild import interrupt

        deadline = started + self.ready_timeout_s
        while time.monotonic() < deadline:
            interrupt.check()
            if self.process.poll() is not None:
                raise TrtbuildError(f"{self.spec.runtime} server for {self.spec.artifact} exited with "
                                    f"{self.process.returncode} before it was ready: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
                    if response.status == 200:
                        self.time_to_ready_s = time.monotonic() - started
                        body = response.read()
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.2)
        else:
            raise TrtbuildError(f"{self.spec.runtime} server for {self.spec.artifact} did not answer GET /v1/models "
                                f"within {self.ready_timeout_s} s (recipe bench.ready_timeout_s): {self.log_tail()}")
        try:  # the name requests must give: vLLM serves the model by its path, llama.cpp by its file
            self.model = json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise TrtbuildError(f"{self.spec.runtime} server for {self.spec.artifact}: GET /v1/models answered "
                                f"without a model (an OpenAI list of models is expected): {body[:200]!r}") from None

    def _stop(self) -> None:
        try:
            if self.process is not None:
                pgid = self.process.pid
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if not group_alive(pgid):
                        break
                    try:
                        os.killpg(pgid, sig)
                    except ProcessLookupError:
                        break
                    deadline = time.monotonic() + STOP_TIMEOUT_S
                    while group_alive(pgid) and time.monotonic() < deadline:
                        self.process.poll()  # reaps the leader, else it stays a zombie of the group
                        time.sleep(0.05)
                self.process.wait(timeout=STOP_TIMEOUT_S)
        finally:
            if self._sampler is not None:
                self._sampler.stop()
                self.peak_rss_mib = self._sampler.peak_rss / 2**20
                if self._sampler.peak_gpu is not None:
                    self.peak_gpu_memory_mib = self._sampler.peak_gpu / 2**20
                self._sampler = None
            if self._log_dir is not None:
                shutil.rmtree(self._log_dir, ignore_errors=True)
                self._log_dir = None
