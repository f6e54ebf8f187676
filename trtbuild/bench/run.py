"""`trtbuild bench`: measure artifacts of a recipe on the runtime that serves them.

For each target: its artifact from the local store (the recipe's lock, else its ref there: built or
pulled), materialized; its runtime started once from the options it packages (bench/server.py); each
workload at each concurrency level driven by a load generator (bench/loadgen.py); one BenchRecord
per (workload, concurrency), with the generator's raw per-request results as a blob, written into
the local store. A run that fails or is interrupted writes no record for the run in progress and
leaves no server behind; the records of runs already finished are kept (each is whole)."""

from __future__ import annotations

import contextlib
import json
import platform as platform_module
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from trtbuild.bench import loadgen as loadgens
from trtbuild.bench import warmstart
from trtbuild.store.measurements import BenchRecord, LoadGenerator, Platform, bench_id
from trtbuild.bench.server import RUNTIMES, RuntimeServer, server_spec
from trtbuild.recipe.bench import Bench, Workload
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.facts import serving as serving_facts
from trtbuild.facts.runtime_names import LLAMACPP_PACKAGE, LLAMACPP_RUNTIME, TRTLLM_RUNTIME

# what serves each kind of artifact, in the order `auto` tries them (the runtime table's order, as pull's)
RUNTIMES_OF = {"gguf": (LLAMACPP_RUNTIME,), "hf-checkpoint": serving_facts.RUNTIMES, "engine": (TRTLLM_RUNTIME,)}
PACKAGE_OF = {**{name: r.package for name, r in serving_facts.RUNTIME_INFO.items()}, LLAMACPP_RUNTIME: LLAMACPP_PACKAGE}
SOURCE_TARGET = "source"  # the recipe's source checkpoint: the tokenizer of artifacts that carry none
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Resolved:
    """A target's artifact in the local store."""

    target: str
    kind: str  # gguf | hf-checkpoint | engine
    digest: str
    size: int
    folder: Path


def load_workloads(path: Path) -> Bench:
    """--workloads FILE: a YAML mapping with the fields of a recipe's `bench:` section."""
    from pydantic import ValidationError

    from trtbuild.recipe.yamlerrors import format_errors
    from trtbuild.recipe.yamlsource import load_located_file

    doc = load_located_file(path)
    if not isinstance(doc.data, dict):
        raise InvalidInput(f"{doc.where(())}: expected a mapping like a recipe's bench: section (workloads, "
                           "ready_timeout_s)")
    try:
        return Bench.model_validate(doc.data)
    except ValidationError as exc:
        raise InvalidInput(*format_errors(exc, doc, Bench)) from None


def _locate(loaded, store, target: str) -> Optional[str]:
    """The digest of `target`'s artifact for this recipe in the local store: its lock's entry (a build,
    or a pull by the lock), else its ref there (a build), when the refs under the recipe's name are
    this recipe's (its claim); None when neither names one."""
    from trtbuild.lock import lockfile
    from trtbuild.recipe.schema import recipe_identity
    from trtbuild.store.records import RecipeClaim

    if store.exists():
        lock = lockfile.read(lockfile.lock_path_for(loaded, store), older_ok=True)
        if lock is not None and lock.recipe.digest == lockfile.recipe_digest(loaded) and target in lock.targets:
            return lock.targets[target].digest
        from trtbuild.store import layout

        found = store.transport.get(layout.claim(loaded.recipe.name))
        if found is not None and RecipeClaim.model_validate_json(found.data).identity != recipe_identity(loaded):
            return None
        ref = store.read_ref(loaded.recipe.name, target)
        if ref is not None:
            return ref.digest
    return None


@dataclass
class Subject:
    """What the targets are named in: a recipe (planned; artifacts by its lock or refs in the local
    store) or a lock file (a deploy host that pulled by it: no source, no planner)."""

    name: str  # the recipe's name
    servable: dict[str, str]  # target -> its kind (gguf | hf-checkpoint | engine)
    locate: Callable[[str], Optional[str]]  # target -> its artifact's digest in the local store, or None
    bench: Bench  # the recipe's bench: section; a lock's: the defaults
    build_hint: str  # how to get a missing target into the local store


def recipe_subject(loaded, store) -> Subject:
    from trtbuild.plan.expand import plan_recipe

    planned = {t.name: t.kind for t in plan_recipe(loaded).targets if t.ok and t.kind in RUNTIMES_OF}
    return Subject(loaded.recipe.name, planned, lambda name: _locate(loaded, store, name), loaded.recipe.bench,
                   f"build or pull it first (`{loaded.command('build')} --target {{target}}`)")


def lock_subject(path: Path, store) -> Subject:
    """A lock file: each servable target's artifact is the one the lock names, when the local store
    holds it (`trtbuild pull LOCK` put it there)."""
    from trtbuild.lock import lockfile

    lock = lockfile.read(path)
    if lock is None:
        raise InvalidInput(f"{path}: no such lock file")
    servable = {name: entry.stage for name, entry in lock.targets.items() if entry.stage in RUNTIMES_OF}

    def locate(name: str) -> Optional[str]:
        entry = lock.targets.get(name)
        return entry.digest if entry is not None and store.exists() and store.has_manifest(entry.digest) else None

    return Subject(lock.recipe.name, servable, locate, Bench(),
                   f"pull it first (`trtbuild pull {path} --target {{target}}`)")


def resolve(subject: Subject, store, targets: list[str]) -> list[Resolved]:
    """Each target's artifact, checked whole and materialized (one line for the first that is not
    a servable target, or is not in the local store)."""
    from trtbuild.store.checkout import materialize

    out = []
    for name in targets:
        if name not in subject.servable:
            raise InvalidInput(f"--target {name}: not a servable target of {subject.name} "
                               f"({', '.join(subject.servable) or 'none'})")
        digest = subject.locate(name)
        if digest is None:
            raise TrtbuildError(f"{name}: not in the local store {store.location}; "
                                + subject.build_hint.format(target=name))
        problem = store.artifact_problem(digest)
        if problem:
            raise TrtbuildError(f"{name}: artifact {digest} is not whole in the local store {store.location} "
                                f"({problem}); build or pull it again")
        manifest = store.get_manifest(digest)
        out.append(Resolved(name, subject.servable[name], digest, sum(e.size for e in manifest.entries),
                            materialize(store, digest)))
    return out


def pick_runtime(kind: str, asked: str, target: str) -> str:
    """`auto`: llama.cpp for gguf, TensorRT-LLM for engines, for an hf-checkpoint the first of vLLM,
    TensorRT-LLM, SGLang that is installed; an explicit runtime that cannot serve the kind is refused."""
    from trtbuild.host.toolchain import package_version

    able = RUNTIMES_OF[kind]
    if asked == "auto":
        for runtime in able:
            if package_version(PACKAGE_OF[runtime]) is not None:
                return runtime
        raise TrtbuildError(f"{target}: no runtime that serves a {kind} is installed here "
                            f"({', '.join(PACKAGE_OF[r] for r in able)})")
    if asked not in able:
        raise InvalidInput(f"--runtime {asked}: does not serve {target} (a {kind}; {', '.join(able)} do)")
    if package_version(PACKAGE_OF[asked]) is None:
        raise TrtbuildError(f"--runtime {asked}: {PACKAGE_OF[asked]} is not installed here")
    return asked


def tokenizer_folder(subject: Subject, store, artifact: Resolved) -> Path:
    """An HF tokenizer with the artifact's vocabulary for the load generator: the artifact's own, else
    (a gguf) the recipe's source checkpoint's, from the local store."""
    from trtbuild.store.checkout import materialize

    if (artifact.folder / TOKENIZER_FILE).is_file():
        return artifact.folder
    digest = subject.locate(SOURCE_TARGET)
    if digest is None or store.artifact_problem(digest):
        raise TrtbuildError(f"{artifact.target}: has no {TOKENIZER_FILE}, and the recipe's {SOURCE_TARGET} "
                            f"checkpoint (its tokenizer) is not whole in the local store {store.location}; "
                            + subject.build_hint.format(target=SOURCE_TARGET))
    return materialize(store, digest)


_EOG = ("import json, sys, llama_cpp\n"
        "m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)\n"
        "v = llama_cpp.llama_model_get_vocab(m.model)\n"
        "print(json.dumps([i for i in range(m.n_vocab()) if llama_cpp.llama_vocab_is_eog(v, i)]))\n")


def end_of_generation_tokens(model: Path) -> list[int]:
    """The tokens llama.cpp ends a generation at (its own vocabulary's answer: the GGUF's eos, and
    tokens such as <|endoftext|> it treats alike), read in a child (llama.cpp writes to fd 2)."""
    result = subprocess.run([sys.executable, "-c", _EOG, str(model)], capture_output=True, text=True)
    if result.returncode != 0:
        raise TrtbuildError(f"{model}: llama.cpp could not read its vocabulary: "
                            f"{(result.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def request_extra(runtime: str, artifact: Resolved) -> dict:
    """What every request adds so the server generates exactly the asked length."""
    if runtime == "llamacpp":
        from trtbuild.builder.stages.gguf import MODEL_FILE

        # llama-cpp-python ignores ignore_eos; -100 makes an end token never sampled
        return {"logit_bias": {str(t): -100 for t in end_of_generation_tokens(artifact.folder / MODEL_FILE)}}
    return {"ignore_eos": True}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform_module.processor() or platform_module.machine()


def host_platform(runtime: str, gpus: int) -> Platform:
    """Where the server runs: llama.cpp's packaged command on the CPU, the others on the GPUs NVML sees."""
    from trtbuild.host.hardware import detect_gpus, driver_info

    if runtime == "llamacpp" or gpus == 0:
        return Platform(device="cpu", product=_cpu_model(), sm=None, count=0, driver=None)
    found = detect_gpus()
    if not found:
        raise TrtbuildError(f"--runtime {runtime}: serves on an NVIDIA GPU, and NVML sees none on this host")
    return Platform(device="gpu", product=found[0].name, sm=found[0].sm, count=gpus, driver=driver_info()["driver"])


def bench(recipe: Optional[Path], targets: list[str], runtime: str = "auto", workloads: Optional[list[str]] = None,
          loadgen: str = "auto", workloads_file: Optional[Path] = None, env: Optional[dict[str, str]] = None,
          say: Callable[[str], None] = lambda line: None, capture_warm_start: bool = False) -> list[BenchRecord]:
    """Measure each target on its runtime with each workload (all of the recipe's, else those named)
    at each of its concurrency levels; the records, in order, each written to the local store as it
    is made. `env`: overrides for the server's environment (a warm-start cache's location).
    `capture_warm_start` (vllm, trtllm): the first start gets a fresh, empty cache folder; once the
    runs end and it is stopped, the runtime is started again on what it left there, timed, and the
    folder captured as the artifact's warm-start cache (bench/warmstart.capture_after_runs)."""
    from trtbuild.host.toolchain import package_version, standin_parts
    from trtbuild.recipe.schema import load_recipe_or_demo
    from trtbuild.store.local import open_store
    from trtbuild.store.records import Digest, utc_now

    store = open_store(None, missing_ok=True)
    subject = (lock_subject(recipe, store) if recipe is not None and recipe.suffix == ".lock"
               else recipe_subject(load_recipe_or_demo(recipe), store))
    section = load_workloads(workloads_file) if workloads_file is not None else subject.bench
    chosen: list[Workload] = []
    for name in workloads or [w.name for w in section.workloads]:
        try:
            chosen.append(section.workload(name))
        except KeyError:
            where = workloads_file or f"{subject.name}'s bench: section"
            raise InvalidInput(f"--workload {name}: not a workload of {where} "
                               f"({', '.join(w.name for w in section.workloads)})") from None
    records: list[BenchRecord] = []
    with store.using(), contextlib.ExitStack() as scratch:  # scratch: the warm-start cache folders, however it ends
        found = resolve(subject, store, targets)
        for artifact in found:
            served_by = pick_runtime(artifact.kind, runtime, artifact.target)
            generator = loadgens.choose(loadgen, served_by)
            tokenizer = tokenizer_folder(subject, store, artifact)
            spec = server_spec(served_by, artifact.folder, f"{artifact.target} ({artifact.digest[:12]})", env)
            cache_root = None
            if capture_warm_start:  # the cold start: a cache folder of its own, empty
                cache_root = scratch.enter_context(store.workspace("bench").work_folder("warmstart")) / "cache"
                cache_root.mkdir()
                spec = server_spec(served_by, artifact.folder, spec.artifact,
                                   {**(env or {}), **warmstart.runtime_env(served_by, cache_root)})
            host = host_platform(served_by, spec.gpus)
            runtime_version = package_version(PACKAGE_OF[served_by])
            extra = request_extra(served_by, artifact)
            say(f"starting {served_by} on {artifact.target}")
            with RuntimeServer(spec, section.ready_timeout_s) as server:
                say(f"{served_by} ready in {server.time_to_ready_s:.1f} s")
                target = loadgens.Target(server.url, server.model, tokenizer, extra)
                for workload in chosen:
                    for concurrency in workload.concurrency:
                        say(f"{artifact.target}: {workload.name} at concurrency {concurrency} ({generator})")
                        with store.workspace("bench").work_folder("bench") as work:
                            out = work / "out"
                            out.mkdir()
                            run = loadgens.RUNNERS[generator](target, workload, concurrency, out)
                            raw = store.put_file_blob(run.raw)
                        peak_rss, peak_gpu = server.peaks()
                        digest = workload.digest(concurrency)
                        record = BenchRecord(
                            id=bench_id(artifact.digest, served_by, runtime_version, host, digest),
                            artifact=Digest(hash=artifact.digest, size_bytes=artifact.size), target=artifact.target,
                            recipe=subject.name, runtime=served_by, runtime_version=runtime_version,
                            platform=host, workload=workload.name, workload_spec=workload.identity(concurrency),
                            workload_digest=digest, figures=run.figures, time_to_ready_s=server.time_to_ready_s,
                            warm_start=None, peak_gpu_memory_mib=peak_gpu, peak_rss_mib=peak_rss,
                            load_generator=LoadGenerator(name=generator, version=run.version, command=run.command),
                            raw=raw, created=utc_now(), host=socket.gethostname(),
                            standin=standin_parts({PACKAGE_OF[served_by]: runtime_version, generator: run.version}))
                        store.put_bench(record)  # each run's record whole as it ends: a later failure keeps it
                        records.append(record)
            if cache_root is not None:
                warmstart.capture_after_runs(store, spec, artifact.digest, artifact.target, server.time_to_ready_s,
                                             section.ready_timeout_s, cache_root, say)
    return records


__all__ = ["bench", "RUNTIMES", "Resolved", "resolve", "pick_runtime", "load_workloads"]
