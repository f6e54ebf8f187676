"""Warm-start caches: a runtime's compile and autotune caches, captured after a start on an artifact,
stored as an artifact of their own with everything that makes them valid (records.WarmStartKey), and
installed on a host only when that host matches every part of the key.

Where the runtimes keep them and what they check themselves: trtbuild/facts/warmstart.py. vLLM's
cache root is VLLM_CACHE_ROOT (torch_compile_cache/, flashinfer_autotune_cache/ ...); TensorRT-LLM's
is the folder of TLLM_AUTOTUNER_CACHE_PATH (it writes <name>.rank<N>.json there). vLLM names its
folders by hashes of most of the key already, so a stale cache would mostly be ignored, not misused;
TensorRT-LLM's autotuner records its version and GPU but checks neither, so a cache from another GPU
would be used as it is. The key is checked here, for both, before anything is written."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Optional

from trtbuild import interrupt
from trtbuild.store.measurements import WarmStartKey, WarmStartRecord
from trtbuild.errors import TrtbuildError
from trtbuild.facts import warmstart as facts
from trtbuild.keys import canonical_json
from trtbuild.store.errors import CorruptStore
from trtbuild.store.records import Digest, utc_now

NONE = "none"  # a string field's value where this host has nothing (no such runtime, no GPU)
FIELDS = tuple(WarmStartKey.model_fields)  # the key's fields, in the order they are judged


class WarmStartRefused(TrtbuildError):
    """A cache whose key differs from this host's, or a destination that holds another cache."""


# ---- this host ------------------------------------------------------------------------------------

def torch_cuda() -> Optional[str]:
    """The CUDA version torch was built with, without importing torch: the `+cuXYZ` of its version, else
    `cuda = '12.8'` in its torch/version.py (PyPI's default wheels and NVIDIA's carry no suffix); None
    for a CPU build or no torch."""
    from trtbuild.host import toolchain

    from trtbuild.host import hardware

    suffixed = toolchain.cuda_version()
    return suffixed if suffixed is not None else hardware.torch_built_cuda()


def host_sm(gpus: int) -> str:
    """The SM of the first `gpus` GPUs NVML sees (those a server started with tp x pp uses), `sm90+sm89`
    when they differ, `none` without any."""
    from trtbuild.host.hardware import detect_gpus

    used = detect_gpus()[:max(gpus, 1)]
    return "+".join(sorted({g.sm for g in used})) if used else NONE


def options_digest(options: dict) -> str:
    """sha256 of the packaged serve options' canonical JSON (the key's serve_options)."""
    return hashlib.sha256(canonical_json(options)).hexdigest()


def host_key(artifact_digest: str, runtime: str, serve_options: dict, tp: int, pp: int,
             served_from: Path) -> WarmStartKey:
    """This host's key for serving `artifact_digest` on `runtime` with `serve_options` (the artifact's
    packaged options, as a dict) at tp x pp from the folder `served_from`: package versions from their
    metadata (nothing imported), the driver and SM from NVML."""
    from trtbuild.host import hardware, toolchain

    if runtime not in facts.RUNTIMES:
        raise TrtbuildError(f"warm-start caches are captured for {', '.join(facts.RUNTIMES)}, not {runtime}")
    return WarmStartKey(
        artifact=artifact_digest, runtime=runtime,
        runtime_version=toolchain.package_version(facts.RUNTIME_PACKAGE[runtime]) or NONE,
        torch=toolchain.package_version("torch"), triton=toolchain.package_version("triton"),
        flashinfer=toolchain.package_version("flashinfer-python"), cuda=torch_cuda(),
        driver=hardware.driver_info()["driver"], sm=host_sm(tp * pp), tp=tp, pp=pp,
        serve_options=options_digest(serve_options),
        served_from=str(Path(os.path.abspath(served_from))) if runtime == "vllm" else None)


# ---- the rule -------------------------------------------------------------------------------------

def _shown(value) -> str:
    return NONE if value is None else str(value)


def differences(stored: WarmStartKey, here: WarmStartKey) -> list[str]:
    """Every field of the key that differs, in the key's order: "sm: cache sm90, host sm89"."""
    return [f"{field}: cache {_shown(getattr(stored, field))}, host {_shown(getattr(here, field))}"
            for field in FIELDS if getattr(stored, field) != getattr(here, field)]


def _package(name: str, stored: Optional[str], here: Optional[str]) -> str:
    def has(version):
        return f"{name} {version}" if version not in (None, NONE) else f"no {name}"

    return f"captured with {has(stored)}, this host has {has(here)}"


def why_not(stored: WarmStartKey, here: WarmStartKey) -> Optional[str]:
    """The first part of the key that differs, in words; None when every part matches."""
    field = next((f for f in FIELDS if getattr(stored, f) != getattr(here, f)), None)
    if field is None:
        return None
    a, b = getattr(stored, field), getattr(here, field)
    if field == "artifact":
        return f"captured on artifact {a[:12]}, this one is {b[:12]}"
    if field == "runtime":
        return f"captured on {a}, this start is on {b}"
    if field == "runtime_version":
        return _package(facts.RUNTIME_PACKAGE[stored.runtime], a, b)
    if field in ("torch", "triton", "flashinfer"):
        return _package("flashinfer-python" if field == "flashinfer" else field, a, b)
    if field == "cuda":
        def built(version):
            return f"built for CUDA {version}" if version else "a CPU build"

        return f"captured with torch {built(a)}, this host's torch is {built(b)}"
    if field == "driver":
        return f"captured with NVIDIA driver {_shown(a)}, this host has " + (b if b else "no NVIDIA driver")
    if field == "sm":
        return f"captured for {a}, this host " + ("has no NVIDIA GPU" if b == NONE else f"is {b}")
    if field in ("tp", "pp"):
        size = "tensor" if field == "tp" else "pipeline"
        return f"captured with {size}-parallel size {a}, this start uses {b}"
    if field == "served_from":
        return (f"captured serving the model from {_shown(a)}, this start serves it from {b} (vLLM names its "
                f"compile cache by the model's path: pull it with --dest {_shown(a)})")
    return f"captured with other serve options (sha256 {a[:12]}), this artifact's are {b[:12]}"


def refusal(record: WarmStartRecord, here: WarmStartKey, target: str) -> Optional[str]:
    """The one line that refuses `record` on this host, or None when it may be installed."""
    reason = why_not(record.key, here)
    if reason is None:
        return None
    return f"warm-start cache {record.cache.hash[:12]} of {target}: {reason}; not installed"


# ---- capture --------------------------------------------------------------------------------------

def capture(store, cache_root: Path, key: WarmStartKey, cold_ready_s: float, warm_ready_s: float) -> WarmStartRecord:
    """Store the runtime's cache folder `cache_root` as an artifact (its files and manifest) and the
    record naming it under `key`. A folder with no file in it is refused: nothing was cached."""
    cache_root = Path(cache_root)
    if not cache_root.is_dir() or not any(p.is_file() for p in cache_root.rglob("*")):
        raise TrtbuildError(f"{cache_root}: the runtime left no cache file there; nothing to capture")
    with store.using():
        manifest = store.ingest(cache_root)
        record = WarmStartRecord(key=key, cache=Digest(hash=manifest.digest, size_bytes=manifest.size),
                                 cold_ready_s=cold_ready_s, warm_ready_s=warm_ready_s, created=utc_now(),
                                 host=socket.gethostname())
        store.put_warmstart(record)
    return record


# ---- install --------------------------------------------------------------------------------------

def _copy_blob(store, sha256: str, dest: Path, executable: bool) -> None:
    """The blob's bytes into a new, writable file (the runtime may rewrite its cache: a hard link to a
    read-only blob would not let it, or, as root, would let it change the store), checked as copied."""
    digest = hashlib.sha256()
    with store.open_blob(sha256) as fin, open(dest, "xb") as fout:
        for chunk in iter(lambda: fin.read(1 << 20), b""):
            digest.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    if digest.hexdigest() != sha256:
        raise CorruptStore(f"blob {sha256} of {store.location} is corrupt: its bytes hash to {digest.hexdigest()}")
    os.chmod(dest, 0o755 if executable else 0o644)


def _same_file(path: Path, sha256: str, size: int) -> bool:
    if not path.is_file() or path.is_symlink() or path.stat().st_size != size:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() == sha256


def _move_in(staged: Path, dest: Path) -> None:
    """Rename what `staged` holds into `dest`, the topmost absent folder or file at a time: a folder the
    runtime looks up (a torch_compile_cache/<hash>) appears whole or not at all."""
    for child in sorted(staged.iterdir()):
        there = dest / child.name
        if not there.exists():
            os.rename(child, there)
        elif child.is_dir() and there.is_dir() and not there.is_symlink():
            _move_in(child, there)


def install(store, record: WarmStartRecord, dest: Path, here: WarmStartKey, target: str = "the artifact") -> Path:
    """Put the cache of `record` (an artifact in `store`) into `dest` (VLLM_CACHE_ROOT for vLLM, the folder
    of TLLM_AUTOTUNER_CACHE_PATH for TensorRT-LLM) when `here` matches every part of its key; else
    WarmStartRefused with one line naming the first part that differs, nothing written. Files already
    in `dest` with the same bytes stay; one with other bytes refuses the install (another cache is
    never overwritten); other files of `dest` (other models' caches) are left alone. The files are
    assembled beside `dest` and renamed into it."""
    line = refusal(record, here, target)
    if line is not None:
        raise WarmStartRefused(line)
    dest = Path(dest)
    manifest = store.get_manifest(record.cache.hash)
    if dest.exists() and not dest.is_dir():
        raise WarmStartRefused(f"{dest}: not a folder; warm-start cache {record.cache.hash[:12]} of {target} "
                               "not installed")
    missing = []
    for entry in manifest.entries:
        path = dest / entry.path
        if path.exists() or path.is_symlink():
            if not _same_file(path, entry.sha256, entry.size):
                raise WarmStartRefused(f"{path}: already there with other bytes (another cache); warm-start cache "
                                       f"{record.cache.hash[:12]} of {target} not installed")
            continue
        missing.append(entry)
    if not missing:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged: Optional[Path] = None
    try:
        with interrupt.held():  # made and guarded at once: Ctrl-C leaves no staging folder behind
            staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.warmstart-", dir=dest.parent))
        for entry in missing:
            path = staged / entry.path
            path.parent.mkdir(parents=True, exist_ok=True)
            _copy_blob(store, entry.sha256, path, entry.executable)
        if not dest.exists():
            os.rename(staged, dest)  # the whole cache appears at once
            staged = None
        else:
            _move_in(staged, dest)
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    return dest


def choose(records: list[WarmStartRecord], here_for: Callable[[WarmStartRecord], WarmStartKey]):
    """(the record to install, None) when one matches this host (the newest such), else (None, the
    record to name in the refusal: the one differing in the fewest parts, the newest of those)."""
    judged = [(record, differences(record.key, here_for(record))) for record in records]
    matching = [record for record, diffs in judged if not diffs]
    if matching:
        return matching[-1], None
    if not judged:
        return None, None
    fewest = min(len(diffs) for _, diffs in judged)
    return None, [record for record, diffs in judged if len(diffs) == fewest][-1]


# ---- the artifact's packaged options ------------------------------------------------------------------

def serve_entries(folder: Path, runtime: str) -> list[tuple[int, int, dict]]:
    """(tp, pp, options) per parallelism entry the artifact packages for `runtime`: serving/ itself, or
    serving/tp2 (tp2-pp2) ... when the recipe listed several. The options as the file holds them (vLLM's
    vllm_args.json object, TensorRT-LLM's llm_api_options.yaml mapping); empty when it packages none."""
    import json

    import yaml

    from trtbuild.serving.options import LLM_API_OPTIONS_FILE, SERVING_DIR, VLLM_ARGS_FILE

    name = {"vllm": VLLM_ARGS_FILE, "trtllm": LLM_API_OPTIONS_FILE}.get(runtime)
    if name is None:
        return []
    serving = Path(folder) / SERVING_DIR
    files = [serving / name] if (serving / name).is_file() else sorted(serving.glob(f"*/{name}"))
    entries = []
    for path in files:
        try:
            options = json.loads(path.read_text()) if runtime == "vllm" else yaml.safe_load(path.read_text())
        except (ValueError, yaml.YAMLError) as exc:
            raise TrtbuildError(f"{path}: not {'JSON' if runtime == 'vllm' else 'YAML'} ({exc})") from None
        if not isinstance(options, dict):
            raise TrtbuildError(f"{path}: expected a mapping of {runtime} serve options")
        if runtime == "vllm":
            tp, pp = options.get("--tensor-parallel-size", 1), options.get("--pipeline-parallel-size", 1)
        else:
            tp, pp = options.get("tensor_parallel_size", 1), options.get("pipeline_parallel_size", 1)
        entries.append((int(tp), int(pp), options))
    return entries


def cache_root(runtime: str, env: Optional[dict] = None) -> Path:
    """Where `runtime` looks for its caches on this host: VLLM_CACHE_ROOT (else $XDG_CACHE_HOME/vllm,
    else ~/.cache/vllm, as vLLM's envs.py decides) for vLLM; the folder of TLLM_AUTOTUNER_CACHE_PATH
    for TensorRT-LLM (else ~/.cache/trtbuild/trtllm-autotuner, where trtbuild points it)."""
    env = os.environ if env is None else env
    if runtime == "vllm":
        if env.get(facts.VLLM_CACHE_ENV):
            return Path(env[facts.VLLM_CACHE_ENV]).expanduser()
        base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base).expanduser() / "vllm"
    if env.get(facts.TRTLLM_CACHE_ENV):
        return Path(env[facts.TRTLLM_CACHE_ENV]).expanduser().parent
    return Path("~/.cache/trtbuild/trtllm-autotuner").expanduser()


def runtime_env(runtime: str, root: Path) -> dict[str, str]:
    """The variables that make `runtime` read and write its caches under `root`."""
    if runtime == "vllm":
        return {facts.VLLM_CACHE_ENV: str(root)}
    return {facts.TRTLLM_CACHE_ENV: str(Path(root) / facts.TRTLLM_CACHE_FILE)}


# ---- pull --warm-start -----------------------------------------------------------------------------

class Installed:
    """What `pull --warm-start` did: installed a cache (its digest, where), refused one (the line), or
    found none captured (both None); `line` is what it says on stderr."""

    def __init__(self, line: str, installed: Optional[str] = None, refused: Optional[str] = None,
                 path: Optional[Path] = None) -> None:
        self.line, self.installed, self.refused, self.path = line, installed, refused, path

    def as_json(self) -> dict:
        return {"installed": self.installed, "refused": self.refused, "path": str(self.path) if self.path else None}


def pull_install(store, target: str, digest: str, folder: Path, runtime: Optional[str],
                 env: Optional[dict] = None) -> Installed:
    """Install, where the runtime looks (cache_root), the warm-start cache captured on artifact `digest`
    (records in `store`) that matches this host for `runtime` (vllm or trtllm; None: any), with the
    artifact's packaged options at `folder`; or say, in one line, why none is installed. A refusal
    writes nothing; a cache already installed is left as it is."""
    records = [r for r in store.warmstart_records(digest) if runtime is None or r.key.runtime == runtime]
    if not records:
        on = f" for {runtime}" if runtime else ""
        return Installed(f"no warm-start cache was captured of {target}{on}; the runtime will compile and tune "
                         "at its first start")
    options: dict[tuple[str, int, int], dict] = {}
    for rt in {r.key.runtime for r in records}:
        for tp, pp, told in serve_entries(folder, rt):
            options[(rt, tp, pp)] = told

    def here_for(record: WarmStartRecord) -> WarmStartKey:
        k = record.key
        # no packaged options for that split: the key's serve_options cannot match, and the line says so
        return host_key(digest, k.runtime, options.get((k.runtime, k.tp, k.pp), {}), k.tp, k.pp, folder)

    chosen, named = choose(records, here_for)
    if chosen is None:
        line = refusal(named, here_for(named), target)
        return Installed(line, refused=line)
    dest = cache_root(chosen.key.runtime, env)
    try:
        install(store, chosen, dest, here_for(chosen), target)
    except WarmStartRefused as exc:  # another cache is in the way: refused as a mismatch is
        return Installed(str(exc), refused=str(exc))
    told = "" if chosen.key.runtime == "vllm" else \
        f" (start trtllm-serve with {facts.TRTLLM_CACHE_ENV}={dest / facts.TRTLLM_CACHE_FILE})"
    return Installed(f"warm-start cache {chosen.cache.hash[:12]} of {target} installed into {dest}{told}",
                     installed=chosen.cache.hash, path=dest)


# ---- bench --capture-warm-start -------------------------------------------------------------------------

def _compile_folders(root: Path) -> set[str]:
    folder = Path(root) / facts.TORCH_COMPILE_CACHE
    return {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()


def capture_after_runs(store, spec, digest: str, target: str, cold_ready_s: float, ready_timeout_s: float,
                       root: Path, say: Callable[[str], None] = lambda line: None) -> WarmStartRecord:
    """The second half of `bench --capture-warm-start`, called once the runs on the first (cold) start
    are over and that server is stopped. The cold start was made with `spec`, whose env pointed the
    runtime at `root`, a fresh empty folder (runtime_env(spec.runtime, root)); this starts the runtime
    again with the same spec (so on the caches the first start left in `root`), times it to ready,
    stops it, and stores `root` as the artifact's warm-start cache under this host's key. vLLM is held
    to its own naming: a second start that made another torch_compile_cache/<hash> folder did not
    reuse the first's (another configuration or path), and nothing is captured then."""
    from trtbuild.bench.server import RuntimeServer

    if spec.runtime not in facts.RUNTIMES:
        raise TrtbuildError(f"--capture-warm-start: {spec.runtime} keeps no cache trtbuild captures "
                            f"({', '.join(facts.RUNTIMES)} do)")
    entries = serve_entries(spec.folder, spec.runtime)
    tp, pp, options = entries[0] if len(entries) == 1 else (1, 1, {})
    cold = _compile_folders(root)
    say(f"starting {spec.runtime} on {target} again, on the caches of its first start")
    with RuntimeServer(spec, ready_timeout_s) as server:
        warm_ready_s = server.time_to_ready_s
    say(f"{spec.runtime} ready in {warm_ready_s:.1f} s with the caches (cold: {cold_ready_s:.1f} s)")
    added = sorted(_compile_folders(root) - cold)
    if spec.runtime == "vllm" and cold and added:
        raise TrtbuildError(f"{target}: the second start of vllm compiled again into "
                            f"{facts.TORCH_COMPILE_CACHE}/{added[0]} instead of reusing the first start's "
                            f"({', '.join(sorted(cold))}); warm-start cache not captured")
    record = capture(store, root, host_key(digest, spec.runtime, options, tp, pp, spec.folder), cold_ready_s,
                     warm_ready_s)
    say(f"warm-start cache {record.cache.hash[:12]} of {target} captured ({record.cache.size_bytes:,} bytes)")
    return record
