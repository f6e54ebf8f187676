"""`trtbuild pull --target auto`: which target of a lock file this host should pull (after NVIDIA
NIM's profiles: compatible ones split from the rest, each with the reason).

The rules, in order:
1. Stand-ins are never chosen; internal nodes (validations, twins, the quantized model) and
   TensorRT-LLM checkpoints are not servable as they are.
2. An engine needs this host's SM and exactly the tensorrt_llm and tensorrt that built it, enough
   GPUs of that SM for its world size and room for one rank on each: engine_check.differences,
   the same comparison `trtbuild check` makes.
3. An hf-checkpoint needs a runtime installed here that serves its format on this SM (the support
   table, trtbuild/data/runtime-support.json, each fact cited) and enough GPUs of that SM to hold its bytes (it counts
   as the fewest GPUs that do: the runtime shards it at load time, so that is its world size).
4. A gguf target (a GGUF file) needs llama-cpp-python installed here (package metadata; its server
   is what the artifact's serving/llamacpp_server.json runs), and no GPU: the packaged command runs
   llama.cpp on the CPU, so it has no world size and no SM or memory rule. Whether this host's
   llama.cpp really loads the file is `trtbuild check`'s question, not the choice's.
5. Among those that fit: a GPU target before a gguf one (a GPU host serves an engine or an
   hf-checkpoint rather than llama.cpp on its CPU; a host without an NVIDIA GPU can only take a
   gguf target), then the fewest GPUs (--prefer throughput: more replicas per host) or the most
   (--prefer latency), then the recipe's variant order (without the recipe: the lock's order), then
   the runtime in --runtime's order (an engine before a checkpoint of the same variant), then the
   lock's order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from trtbuild.host import hardware
from trtbuild.lock import verdict
from trtbuild.facts import serving
from trtbuild.facts import serving as serving_table  # _hf_candidate's local `serving` is a list of SMs
from trtbuild.deploy.engine_check import HostFacts, differences
from trtbuild.plan.estimate import format_bytes
from trtbuild.lock.lockfile import LockedTarget, LockFile, targets_of
from trtbuild.facts.gpus import resolve_gpu, sm_number
from trtbuild.facts.nodeids import variant_of
from trtbuild.facts import llamacpp as llamacpp_facts
from trtbuild.facts.runtime_names import LLAMACPP_RUNTIME
from trtbuild.facts.serving import serving_sms
from trtbuild.host.toolchain import EngineToolchain, package_version, probe_engine_toolchain

RUNTIMES = serving.PULL_RUNTIMES  # --runtime's choices besides auto, in preference order
PREFER = ("throughput", "latency")
SERVABLE_STAGES = ("engine", "hf-checkpoint", "gguf")
LLAMACPP_PACKAGE = "llama_cpp"  # toolchain.package_version's name of llama-cpp-python (its distributions)
LLAMACPP_INSTALL = llamacpp_facts.INSTALL
# How describe() names a package where its JSON key (a Python identifier) is not the name people install
PACKAGE_LABELS = {"llama_cpp_python": "llama-cpp-python"}

@dataclass(frozen=True)
class Host:
    """What this host offers: GPUs (NVML), the engine toolchain, the installed version of each
    runtime table runtime's package, and of llama-cpp-python (package metadata)."""

    gpus: tuple[hardware.DetectedGpu, ...]
    tensorrt_llm: Optional[str]
    tensorrt: Optional[str]
    runtimes: dict[str, Optional[str]] = field(default_factory=dict)  # runtime -> its package's version
    gpu_filter: Optional[str] = None  # --gpu SM: only this host's GPUs of that SM count
    llama_cpp_python: Optional[str] = None  # what serves a gguf target (LLAMACPP_RUNTIME)
    cpu: Optional[str] = None  # the CPU's model name: a gguf target's measurements are of it

    def runtime_version(self, runtime: str) -> Optional[str]:
        return self.runtimes.get(runtime)

    def _packages(self) -> dict[str, Optional[str]]:
        """package -> version: the engine toolchain's, then each runtime's (once: trtllm's is tensorrt_llm)."""
        out = {"tensorrt_llm": self.tensorrt_llm, "tensorrt": self.tensorrt}
        for runtime, version in self.runtimes.items():
            out.setdefault(serving.RUNTIME_INFO[runtime].package, version)
        out["llama_cpp_python"] = self.llama_cpp_python
        return out

    @classmethod
    def probe(cls, gpu: str = "auto") -> "Host":
        gpus = hardware.detect_gpus()
        sm = None
        if gpu != "auto":
            sm = _parse_sm(gpu)
            gpus = tuple(g for g in gpus if g.sm == sm)
        engine = probe_engine_toolchain()
        runtimes = {name: package_version(r.package) for name, r in serving.RUNTIME_INFO.items()}
        return cls(gpus, engine.tensorrt_llm, engine.tensorrt, runtimes, sm, package_version(LLAMACPP_PACKAGE),
                   hardware.cpu_model())

    def engine_host(self) -> HostFacts:
        return HostFacts(self.gpus, EngineToolchain(tensorrt_llm=self.tensorrt_llm, tensorrt=self.tensorrt))

    def describe(self) -> str:
        if self.gpus:
            names: dict[tuple[str, str, int], int] = {}
            for g in self.gpus:
                names[(g.name, g.sm, g.memory_bytes)] = names.get((g.name, g.sm, g.memory_bytes), 0) + 1
            gpus = ", ".join(f"{n}x {name} ({sm}, {format_bytes(mem)})" for (name, sm, mem), n in names.items())
        else:
            gpus = f"no {self.gpu_filter} GPU" if self.gpu_filter else "no NVIDIA GPU"
        parts = [gpus]
        parts.extend(package_words(name, version) for name, version in self._packages().items())
        return ", ".join(parts)

    def as_json(self) -> dict:
        return {"gpus": [{"index": g.index, "name": g.name, "sm": g.sm, "memory_bytes": g.memory_bytes} for g in self.gpus],
                **self._packages(), "gpu": self.gpu_filter}


def package_words(name: str, version: Optional[str]) -> str:
    """`vllm 0.33.0` or `no vllm`, a package as Host.describe names it."""
    label = PACKAGE_LABELS.get(name, name)
    return f"{label} {version}" if version else f"no {label}"


def _parse_sm(value: str) -> str:
    from trtbuild.errors import InvalidInput

    try:
        return resolve_gpu(value).sm
    except ValueError as exc:
        raise InvalidInput(f"--gpu: {exc}") from None


@dataclass
class Candidate:
    target: str
    stage: str
    reasons: list[str] = field(default_factory=list)  # why it does not fit; empty when it does
    runtime: Optional[str] = None
    world_size: Optional[int] = None
    variant: Optional[str] = None

    @property
    def fits(self) -> bool:
        return not self.reasons

    def as_json(self) -> dict:
        return {"target": self.target, "stage": self.stage, "fits": self.fits, "runtime": self.runtime,
                "world_size": self.world_size, "variant": self.variant, "reasons": self.reasons}


@dataclass
class Selection:
    chosen: Optional[Candidate]
    candidates: list[Candidate]  # every target of the lock, in the lock's order
    chosen_by: Optional[str] = None  # "measured" or "rule" when measurements were asked for; None otherwise
    measured: Optional[object] = None  # measured.Measured: the figures that chose
    note: Optional[str] = None  # the one line that says how it was chosen (pull prints it on stderr)

    def chosen_by_json(self) -> Optional[dict]:
        if self.chosen_by is None:
            return None
        return {"by": self.chosen_by, **(self.measured.as_json() if self.measured is not None else
                                         {"workload": None, "concurrency": None, "product": None, "figures": []})}


def _runtime_problem(runtime: str, version: Optional[str]) -> Optional[str]:
    """Why the installed `version` of `runtime` does not count for an hf-checkpoint, or None: not
    installed, older than the runtime table's oldest where the table says why (the PyTorch backend
    of TensorRT-LLM serves them from 1.3 on), or a version the table does not cover."""
    if version is None:
        return "not installed"
    older = serving.RUNTIME_INFO[runtime].older
    if older is not None and not serving.at_least_oldest(runtime, version):
        return f"{version} is installed; " + older.format(oldest=serving.oldest_version(runtime))
    if serving.covered_version(runtime, version) is None:  # the table's facts are for the versions it covers
        return serving.outside_table(runtime, version)
    return None


def _format_label(quant: Optional[str], kv: Optional[str]) -> str:
    return (quant or "unquantized") + (f" with {kv} KV cache" if kv else "")


def _hf_candidate(cand: Candidate, target: LockedTarget, fmt: Optional[tuple[Optional[str], Optional[str]]],
                  host: Host, runtimes: tuple[str, ...]) -> None:
    if fmt is None:
        cand.reasons.append("format: unknown (no recipe given, and the store has no action record for its key)")
        return
    quant, kv = fmt
    label = _format_label(quant, kv)
    versions = {runtime: host.runtime_version(runtime) for runtime in serving_table.RUNTIMES}
    installed = {runtime: _runtime_problem(runtime, version) for runtime, version in versions.items()}
    if not host.gpus:
        cand.reasons.append("gpu: " + (f"this host has no {host.gpu_filter} GPU" if host.gpu_filter
                                       else "this host has no NVIDIA GPU (NVML sees none)"))
        return
    sms = sorted({g.sm for g in host.gpus}, key=sm_number)
    reasons = []
    for runtime in runtimes:
        problem = installed[runtime]
        if problem:
            reasons.append(f"{runtime}: {problem}")
            continue
        serving = serving_sms(runtime, quant, kv, sms, serving_table.covered_version(runtime, versions[runtime]))
        if target.serves is not None:  # the build's loader check, where the lock has it, narrows the table
            if runtime not in target.serves:
                reasons.append(f"{runtime}: its loader rules reject this checkpoint (the build's serving/check.json)")
                continue
            serving = [sm for sm in serving if sm in target.serves[runtime]]
        if not serving:
            reasons.append(f"{runtime}: does not serve {label} on {'/'.join(sms)}")
            continue
        gpus = [g for g in host.gpus if g.sm in serving]
        smallest = min(g.memory_bytes for g in gpus)
        need = max(1, math.ceil(target.size / smallest))
        if need > len(gpus):
            reasons.append(f"memory: the checkpoint is {format_bytes(target.size)}; this host's {len(gpus)} GPU"
                           f"{'s hold' if len(gpus) != 1 else ' holds'} {format_bytes(smallest)} each")
            continue
        cand.runtime, cand.world_size = runtime, need
        return
    cand.reasons.extend(reasons)


def _gguf_candidate(cand: Candidate, host: Host) -> None:
    if host.llama_cpp_python is None:
        cand.reasons.append(f"{LLAMACPP_RUNTIME}: llama-cpp-python is not installed ({LLAMACPP_INSTALL})")
        return
    cand.runtime = LLAMACPP_RUNTIME  # on the CPU: no world size


def served_on(runtime: Optional[str], world_size: Optional[int]) -> str:
    """Where a fitting candidate runs, as pull and ls say it: `2 GPUs`, or `CPU` for llama.cpp."""
    if runtime == LLAMACPP_RUNTIME:
        return "CPU"
    return f"{world_size} GPU{'s' if world_size != 1 else ''}"


def _engine_candidate(cand: Candidate, target: LockedTarget, host: Host) -> None:
    p = target.platform
    if p is None:
        cand.reasons.append("platform: the lock records none for this engine (written before trtbuild recorded it); rebuild it")
        return
    cand.reasons.extend(differences(p, host.engine_host()))
    cand.runtime, cand.world_size = serving_table.ENGINE_RUNTIME, p.world_size


def choose(lock: LockFile, host: Host, runtime: str = "auto", prefer: str = "throughput",
           formats: Optional[Callable[[str, LockedTarget], Optional[tuple[Optional[str], Optional[str]]]]] = None,
           variant_order: Optional[list[str]] = None, published_only: bool = True,
           allow_unvalidated: bool = False, measurements: Optional[Callable[[str], list]] = None) -> Selection:
    """Every target of `lock` judged against `host`, and the one to pull (None when nothing fits).
    `formats(id, target)`: an hf-checkpoint's (quant, kv_cache); `variant_order`: the recipe's;
    `published_only`: a target the rule of what a store publishes holds back never fits (False for
    a lock made of a store's refs, which are what it publishes); `allow_unvalidated` (`pull
    --allow-unvalidated`): as `push --allow-unvalidated`, what no validation judged may be chosen;
    `measurements(digest)`: an artifact's bench records (asked once per fitting candidate of the
    chosen kind, GPU or gguf), which rank before the rule when they compare two of them (measured.py)."""
    runtimes = RUNTIMES if runtime == "auto" else (runtime,)
    candidates = []
    for target_id, target in targets_of(lock):
        cand = Candidate(target_id, target.stage, variant=variant_of(target_id))
        why = verdict.lock_verdict(lock, target_id, allow_unvalidated) if published_only else None
        if why:  # never published: the build's words (trtbuild/lock/publication.py)
            cand.reasons.append(f"held back: {why}")
        elif target.stage == "checkpoint":
            cand.reasons.append("a TensorRT-LLM checkpoint: no runtime serves it as it is (the engines built from it do)")
        elif target.stage == "engine":
            if serving_table.ENGINE_RUNTIME not in runtimes:
                cand.reasons.append(f"runtime: --runtime {runtime} does not load TensorRT engines")
            else:
                _engine_candidate(cand, target, host)
        elif target.stage == "gguf":
            if LLAMACPP_RUNTIME not in runtimes:
                cand.reasons.append(f"runtime: --runtime {runtime} does not serve GGUF files")
            else:
                _gguf_candidate(cand, host)
        else:
            hf_runtimes = tuple(r for r in runtimes if r in serving.RUNTIMES)
            if not hf_runtimes:
                cand.reasons.append(f"runtime: --runtime {runtime} does not serve Hugging Face checkpoints")
            else:
                _hf_candidate(cand, target, formats(target_id, target) if formats else None, host, hf_runtimes)
        candidates.append(cand)
    order = {tid: i for i, (tid, _) in enumerate(targets_of(lock))}
    variants = list(variant_order or [])

    def rank(c: Candidate) -> tuple:
        v = variants.index(c.variant) if c.variant in variants else len(variants)
        gpus = c.world_size or 0  # llama.cpp's: none
        return (c.runtime == LLAMACPP_RUNTIME, gpus if prefer == "throughput" else -gpus, v, RUNTIMES.index(c.runtime),
                order[c.target])

    fitting = sorted((c for c in candidates if c.fits), key=rank)
    selection = Selection(fitting[0] if fitting else None, candidates)
    if measurements is not None and selection.chosen is not None:
        _by_measurement(selection, fitting, lock, host, prefer, measurements)
    return selection


def _by_measurement(selection: Selection, fitting: list[Candidate], lock: LockFile, host: Host, prefer: str,
                    measurements: Callable[[str], list]) -> None:
    """Replace the rule's choice by the best measured one of the same kind (GPU, or llama.cpp on the
    CPU) when this host's product has figures comparing two of them; say which way it went."""
    from trtbuild.deploy import measured

    gguf = measured.is_gguf(selection.chosen)
    kind = [c for c in fitting if measured.is_gguf(c) == gguf]
    found = measured.host_product(host.gpus, host.cpu, gguf)
    ranked = None
    if found is not None and len(kind) >= 2:
        digests = {c.target: lock.targets[c.target].digest for c in kind}
        ranked = measured.rank(kind, digests, measurements, prefer, *found)
    if ranked is None:
        selection.chosen_by = "rule"
        if len(kind) < 2:  # one fits: nothing was chosen between
            return
        selection.note = measured.describe_rule(selection.chosen.target, found[1] if found else None, prefer, gguf)
        return
    selection.chosen, selection.measured = ranked
    selection.chosen_by = "measured"
    selection.note = measured.describe(selection.chosen.target, selection.measured, prefer)


def no_fit_lines(selection: Selection, host: Host, lock_name: str, build_command: str) -> list[str]:
    """When nothing fits: every target with why not, and the build that would make one."""
    lines = [f"no target of {lock_name} fits this host ({host.describe()}):"]
    if not selection.candidates:
        lines.append("  (the lock has no targets)")
    for c in selection.candidates:
        lines.append(f"  {c.target}: {'; '.join(c.reasons)}")
    lines.append(build_command)
    return lines


def build_hint(recipe: str, lock: LockFile, host: Host) -> str:
    """The `trtbuild build` command that would make a target for this host ("" for `recipe`: the
    embedded demo, built by the bare command); or, when the lock has gguf targets and this host
    lacks llama-cpp-python, the install that would serve them."""
    recipe = f" {recipe}" if recipe else ""
    if host.llama_cpp_python is None and any(t.stage == "gguf" for _, t in targets_of(lock)):
        # the lock already holds what this host could serve without a GPU: no build is needed
        return f"to serve its gguf targets (on the CPU): `{LLAMACPP_INSTALL}`"
    if not host.gpus and host.gpu_filter:
        return (f"to make one: run `trtbuild build{recipe} --gpu auto` on a host with an {host.gpu_filter} GPU "
                "and tensorrt_llm")
    if not host.gpus:
        return (f"to make one: on a host with an NVIDIA GPU and tensorrt_llm, run "
                f"`trtbuild build{recipe} --gpu auto` (engines are built on the GPU they run on)")
    sms = sorted({g.sm for g in host.gpus}, key=sm_number)
    engine_sms = {t.platform.sm for _, t in targets_of(lock) if t.platform is not None}
    missing = [sm for sm in sms if sm not in engine_sms]
    command = f"`trtbuild build{recipe} --gpu auto`"
    if missing and len(missing) == len(sms):
        return f"to make one: add {'/'.join(missing)} to the recipe's `gpus:`, then run {command} on this host"
    return f"to make one: run {command} on this host"
