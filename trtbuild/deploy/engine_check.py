"""`trtbuild check ENGINE_DIR`: can this host load that engine? And if not, which engine target of
the lock file would it load instead?

An engine runs only on the SM it was built for, with the exact TensorRT and TensorRT-LLM that built
it (TensorRT's deserializer rejects anything else: reference/trtllm.md section 4), on at least as
many GPUs as its world size, each with room for one rank's engine. The engine's side comes from its
`config.json` (as TensorRT-LLM writes it) and `trtbuild.json` (what trtbuild recorded: the SM is
written nowhere else); this host's side from NVML and package metadata, never an import of tensorrt.

A stand-in engine (tests: made by the stand-in trtllm-build, versions labelled `+standin`) is not
a TensorRT engine at all, so it never fits: its own line says so, and the exit code is 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from pydantic import ValidationError

from trtbuild.host import hardware
from trtbuild.errors import InvalidInput
from trtbuild.facts.gpus import sm_number
from trtbuild.plan.estimate import format_bytes
from trtbuild.store.platform import EnginePlatform
from trtbuild.store.summaries import EngineSummary
from trtbuild.host.toolchain import EngineToolchain, is_standin_version, probe_engine_toolchain


def engine_json(engine: EnginePlatform) -> dict[str, Any]:
    """`check --json`'s `engine` (docs/schemas/check.schema.json): the platform without the image,
    which a deploy host does not compare."""
    return engine.model_dump(mode="json", exclude={"image"})


@dataclass(frozen=True)
class HostFacts:
    gpus: tuple[hardware.DetectedGpu, ...]
    toolchain: EngineToolchain
    driver: dict = field(default_factory=dict)

    @classmethod
    def probe(cls) -> "HostFacts":
        return cls(hardware.detect_gpus(), probe_engine_toolchain(), hardware.driver_info())

    def as_json(self) -> dict:
        return {"gpus": [{"index": g.index, "name": g.name, "sm": g.sm, "memory_bytes": g.memory_bytes} for g in self.gpus],
                "tensorrt_llm": self.toolchain.tensorrt_llm, "tensorrt": self.toolchain.tensorrt,
                "cuda": self.toolchain.cuda, **self.driver}


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidInput(f"{path}: not found; {path.parent} is not {what}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(f"{path}: not JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: not a JSON object")
    return data


def read_engine(engine_dir: Path) -> EnginePlatform:
    """The facts of the engine in `engine_dir`; anything that is not an engine trtbuild built is
    one line naming the file."""
    if not engine_dir.is_dir():
        raise InvalidInput(f"{engine_dir}: not a folder (an engine folder holds config.json and rank<N>.engine)")
    config_path = engine_dir / "config.json"
    config = _read_json(config_path, "a TensorRT-LLM engine folder")
    pretrained = config.get("pretrained_config")
    if not isinstance(pretrained, dict) or not isinstance(config.get("build_config"), dict) or "version" not in config:
        raise InvalidInput(f"{config_path}: not a TensorRT-LLM engine config (it needs version, pretrained_config "
                           "and build_config; a checkpoint's config.json has none of them)")
    mapping = pretrained.get("mapping") or {}
    tp, pp = mapping.get("tp_size", 1), mapping.get("pp_size", 1)
    world_size = mapping.get("world_size", tp * pp if isinstance(tp, int) and isinstance(pp, int) else None)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (world_size, tp, pp)):
        raise InvalidInput(f"{config_path}: pretrained_config.mapping: world_size, tp_size and pp_size must be "
                           f"positive integers (found {world_size!r}, {tp!r}, {pp!r})")
    ranks = [engine_dir / f"rank{r}.engine" for r in range(world_size)]
    for path in ranks:
        if not path.is_file():
            raise InvalidInput(f"{path}: not found (config.json's mapping has world_size {world_size})")

    record_path = engine_dir / "trtbuild.json"
    raw = _read_json(record_path, "an engine trtbuild built (trtbuild.json records its SM, which config.json does not)")
    try:  # the engine stage's summary, as strict as the record that holds it
        record = EngineSummary.model_validate({**raw, "kind": raw.get("kind", "engine")})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise InvalidInput(f"{record_path}: {where}: {error['msg']}") from None
    for name, recorded, configured in (("world_size", record.world_size, world_size), ("tp", record.tp, tp),
                                       ("pp", record.pp, pp)):
        if recorded != configured:
            raise InvalidInput(f"{record_path}: {name} {recorded}, but config.json's mapping says {configured}")

    version = str(config["version"])  # what TensorRT-LLM wrote: the one that built it
    standin = record.standin or any(is_standin_version(v) for v in (version, record.toolchain.tensorrt_llm,
                                                                     record.toolchain.tensorrt))
    quantization = pretrained.get("quantization") if isinstance(pretrained.get("quantization"), dict) else None
    return EnginePlatform(sm=record.sm, tp=tp, pp=pp, world_size=world_size, tensorrt_llm=version,
                          tensorrt=record.toolchain.tensorrt, image=record.toolchain.image, quantization=quantization,
                          engine_bytes_per_rank=record.memory.engine_bytes_per_rank, standin=standin)


def is_hf_checkpoint(folder: Path) -> bool:
    """A Hugging Face checkpoint folder (the loader check's input), not an engine folder: a
    config.json with `architectures` or `model_type` that is not an engine config, and no
    trtbuild.json (the engine stage writes one beside every engine)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(config, dict) or (folder / "trtbuild.json").exists():
        return False
    if "pretrained_config" in config or "build_config" in config:
        return False
    return "architectures" in config or "model_type" in config


def _gpu_summary(gpus) -> str:
    names: dict[str, int] = {}
    for g in gpus:
        names[g.name] = names.get(g.name, 0) + 1
    return ", ".join(f"{n}x {name}" for name, n in names.items())


def differences(engine: EnginePlatform, host: HostFacts) -> list[str]:
    """One line per way `engine` does not fit `host`; empty when it fits."""
    lines = []
    if engine.standin:
        lines.append(f"stand-in: made by a stand-in toolchain (tensorrt_llm {engine.tensorrt_llm}), not by TensorRT: "
                     "it is not an engine anything can load")
    if not host.gpus:
        lines.append(f"sm: the engine is for {engine.sm}; this host has no NVIDIA GPU (NVML sees none)")
    elif engine.sm not in {g.sm for g in host.gpus}:
        sms = "/".join(sorted({g.sm for g in host.gpus}, key=sm_number))
        lines.append(f"sm: the engine is for {engine.sm}; this host has {sms} ({_gpu_summary(host.gpus)})")
    for name in ("tensorrt_llm", "tensorrt"):
        built, here = getattr(engine, name), getattr(host.toolchain, name)
        if built is None:
            lines.append(f"{name}: the engine does not record which {name} built it; this host has {here or 'none'}")
        elif built != here:  # TensorRT deserializes only what its own version serialized
            lines.append(f"{name}: the engine was built with {built}; this host has {here or 'none'}")
    matching = [g for g in host.gpus if g.sm == engine.sm]
    if matching and engine.world_size > len(matching):
        lines.append(f"world size: the engine needs {engine.world_size} GPUs (tp {engine.tp} x pp {engine.pp}); "
                     f"this host has {len(matching)} {engine.sm} GPU{'s' if len(matching) != 1 else ''}")
    if matching and engine.engine_bytes_per_rank is not None:
        smallest = min(matching, key=lambda g: g.memory_bytes)
        if engine.engine_bytes_per_rank > smallest.memory_bytes:
            lines.append(f"memory: one rank's engine is {format_bytes(engine.engine_bytes_per_rank)}; "
                         f"this host's {smallest.name} has {format_bytes(smallest.memory_bytes)}")
    return lines


def fitting_lock_targets(lock, engine: EnginePlatform, host: HostFacts) -> list[str]:
    """Engine targets of `lock` that fit `host`, of the same quantization as `engine` where both
    record it (another quantization is another model, not a substitute). Stand-ins never qualify."""
    fits = []
    for target_id, target in sorted(lock.targets.items()):
        p = target.platform
        if target.stage != "engine" or p is None or p.standin:
            continue
        if engine.quantization is not None and p.quantization is not None and p.quantization != engine.quantization:
            continue
        if not differences(p, host):
            fits.append(target_id)
    return fits


@dataclass
class CheckResult:
    engine_dir: Path
    engine: EnginePlatform
    host: HostFacts
    differences: list[str]
    lock_path: Optional[Path] = None
    instead: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.differences

    @property
    def exit_code(self) -> int:
        return 0 if self.fits else 1

    def lines(self) -> list[str]:
        if self.fits:
            e, gpus = self.engine, [g for g in self.host.gpus if g.sm == self.engine.sm]
            return [f"OK: {self.engine_dir} ({e.sm}, tp {e.tp} x pp {e.pp}, tensorrt_llm {e.tensorrt_llm}, "
                    f"tensorrt {e.tensorrt}) fits this host ({_gpu_summary(gpus)})"]
        out = list(self.differences)
        if self.lock_path is not None:
            if self.instead:
                out += [f"instead: {target} (in {self.lock_path}) fits this host" for target in self.instead]
            else:
                out.append(f"instead: no engine target of {self.lock_path} fits this host")
        return out

    def as_json(self) -> dict[str, Any]:
        return {"engine_dir": str(self.engine_dir), "fits": self.fits, "standin": self.engine.standin,
                "differences": self.differences, "lock": str(self.lock_path) if self.lock_path else None,
                "instead": self.instead, "engine": engine_json(self.engine), "host": self.host.as_json()}


def check(engine_dir: Path, lock_path: Optional[Path] = None, host: Optional[HostFacts] = None) -> CheckResult:
    engine = read_engine(engine_dir)
    lock = None
    if lock_path is not None:
        from trtbuild.lock import lockfile

        lock = lockfile.read(lock_path)
        if lock is None:
            raise InvalidInput(f"--lock {lock_path}: not found")
    host = host or HostFacts.probe()
    result = CheckResult(engine_dir, engine, host, differences(engine, host), lock_path)
    if lock is not None and not result.fits:
        result.instead = fitting_lock_targets(lock, engine, host)
    return result
