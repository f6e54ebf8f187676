"""The engine stage: `trtllm-build` on a TensorRT-LLM checkpoint, for one GPU architecture.

The command comes from trtbuild/plan/engine_command.py (one place), run in a work folder beside the
artifact that holds `checkpoint/` (the input, read-only) and the timing cache, either here
(`trtllm-build` on PATH, from the environment whose tensorrt_llm the key names) or in the recipe's
container image (`docker run`, the image pinned by digest). Its output goes to this worker's
stdout, which is the stage's log (a blob named in the action record).

The artifact is `config.json` and `rank{N}.engine` as trtllm-build wrote them, plus trtbuild.json:
what the key determines (SM, parallelism, quantization, checkpoint digest, toolchain, the command).
The GPU it ran on, the seconds and the log differ from host to host for the same key, so they are
in the action record, not here. After the build the folder is checked against what was asked: one
engine per rank, the config's version, mapping and quantization; a mismatch fails the stage.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Optional

from trtbuild.plan import engine_command
from trtbuild.host import hardware
from trtbuild.facts import trtllm
from trtbuild.facts.quantformats import GROUP_SIZED_ALGOS
from trtbuild.errors import TrtbuildError
from trtbuild.builder.stages.base import BuildNeeds, StageContext
from trtbuild.store.summaries import EngineMemory, EngineSummary, EngineToolchainUsed

TAIL_LINES = 12  # lines of trtllm-build's output a failure shows
LIMITS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")


class EngineBuildFailed(TrtbuildError):
    pass


def host_memory_problem(needs: Optional[BuildNeeds], gpus: list, workers: int, available: Optional[int]) -> Optional[str]:
    """Why this host has too little memory for a build with `workers` ranks at once (the plan's
    estimate, estimate.build_memory_needs), or None. `available`: host memory free now."""
    if not needs:
        return None
    from trtbuild.plan.estimate import format_bytes

    host = needs.host_ram_bytes_per_worker * workers
    if available is not None and host > available:
        return (f"the build needs {format_bytes(host)} of host memory with {workers} worker(s) (plan estimate: "
                f"estimate.build_memory_needs) and this host has {format_bytes(available)} available")
    per_worker = needs.gpu_bytes_per_worker
    if gpus and per_worker > min(g.memory_bytes for g in gpus):
        smallest = min(gpus, key=lambda g: g.memory_bytes)
        return (f"each build worker needs {format_bytes(per_worker)} of GPU memory (plan estimate: "
                f"estimate.build_memory_needs) and {smallest.name} has {format_bytes(smallest.memory_bytes)}")
    return None


def _available_ram() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _local_gpus(sm: str) -> list:
    return [g for g in hardware.detect_gpus() if g.sm == sm]


def container_argv(image: str, work: Path, checkpoint: Path, argv: list[str], gpus: list) -> list[str]:
    """`docker run` of `argv` in `image`: the work folder mounted at /work (its working directory),
    the checkpoint read-only at /work/checkpoint, the GPUs of the engine's SM, this user's ids (the
    engine files stay ours), and the shared memory and memlock limits NVIDIA's containers ask for."""
    devices = ",".join(str(g.index) for g in gpus) if gpus else "all"
    return ["docker", "run", "--rm", "--gpus", f'"device={devices}"', "--ipc=host", "--ulimit", "memlock=-1",
            "--ulimit", "stack=67108864", "--user", f"{os.getuid()}:{os.getgid()}",
            "-v", f"{work}:/work", "-v", f"{checkpoint}:/work/{engine_command.CHECKPOINT_DIR}:ro", "-w", "/work",
            image, *argv]


def run_logged(argv: list[str], cwd: Path) -> tuple[int, list[str]]:
    """Run `argv`, its output copied to this worker's stdout (the stage log); the return code and
    the last lines."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if line.strip():
            tail.append(line.rstrip("\n"))
    sys.stdout.flush()
    return proc.wait(), list(tail)


def check_engine(folder: Path, checkpoint_config: dict, params: dict, tensorrt_llm: Optional[str]) -> list[str]:
    """What differs between the engine folder and what was asked (empty when it is right)."""
    problems = []
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"config.json unreadable: {exc}"]
    pretrained = config.get("pretrained_config") or {}
    asked_mapping = checkpoint_config.get("mapping") or {}
    mapping = pretrained.get("mapping") or {}
    for name in ("world_size", "tp_size", "pp_size"):
        if int(mapping.get(name, 1)) != int(asked_mapping.get(name, 1)):
            problems.append(f"mapping.{name} is {mapping.get(name, 1)}, the checkpoint's is {asked_mapping.get(name, 1)}")
    world = int(asked_mapping.get("world_size", 1))
    engines = sorted(p.name for p in folder.glob("rank*.engine"))
    expected = [f"rank{r}.engine" for r in range(world)]
    if sorted(engines) != sorted(expected):
        problems.append(f"engine files {engines or 'none'}, expected {expected}")
    if tensorrt_llm is not None and config.get("version") != tensorrt_llm:
        problems.append(f"config.json version {config.get('version')!r}, the toolchain is tensorrt_llm {tensorrt_llm}")
    asked_quant = checkpoint_config.get("quantization") or {}
    quant = pretrained.get("quantization") or {}
    for name in ("quant_algo", "kv_cache_quant_algo"):
        if quant.get(name) != asked_quant.get(name):
            problems.append(f"quantization.{name} is {quant.get(name)!r}, the checkpoint's is {asked_quant.get(name)!r}")
    build = config.get("build_config") or {}
    for name in LIMITS:
        if name in params and build.get(name) != params[name]:
            problems.append(f"build_config.{name} is {build.get(name)!r}, asked {params[name]!r}")
    return problems


def _quantization(checkpoint_config: dict) -> dict:
    """The checkpoint's quantization as a deploy host compares it: the algorithms, and the group
    size where the format has one."""
    quant = checkpoint_config.get("quantization") or {}
    out = {"quant_algo": quant.get("quant_algo"), "kv_cache_quant_algo": quant.get("kv_cache_quant_algo")}
    if quant.get("group_size") is not None and quant.get("quant_algo") in GROUP_SIZED_ALGOS:
        out["group_size"] = quant["group_size"]
    return out


def build_engine(ctx: StageContext) -> None:
    from trtbuild.host import toolchain

    params, runtime = ctx.params, ctx.runtime
    sm = runtime.platform["sm"]
    keyed_toolchain = runtime.toolchain
    image = runtime.image
    checkpoint = ctx.inputs["checkpoint"]
    checkpoint_config = json.loads((checkpoint / "config.json").read_text())
    world = int((checkpoint_config.get("mapping") or {}).get("world_size", 1))

    gpus = _local_gpus(sm)
    workers = engine_command.workers_for(world, len(gpus))
    problem = host_memory_problem(runtime.build_needs, gpus, workers, _available_ram())
    if problem:  # before an hour of building, not after
        raise EngineBuildFailed(problem)

    work = ctx.out.parent / "build"
    work.mkdir()
    timing_in = runtime.timing_cache_in
    if timing_in:
        shutil.copyfile(timing_in, work / engine_command.TIMING_CACHE_IN)
    argv = engine_command.build_argv(params, workers, timing_cache_in=bool(timing_in))
    if image:
        (work / engine_command.CHECKPOINT_DIR).mkdir()  # the mount point
        probe = toolchain.probe_engine_toolchain(image)
        wrong = (trtllm.check_engine_toolchain(probe.tensorrt_llm) if probe.tensorrt_llm
                 else "it has no tensorrt_llm (trtbuild builds engines with tensorrt_llm 1.2.x)")
        if wrong:  # the digest pins the image, not what is in it: say so before docker runs the build
            raise EngineBuildFailed(f"image {image}: {wrong}")
        command = container_argv(image, work, checkpoint, argv, gpus)
    else:
        (work / engine_command.CHECKPOINT_DIR).symlink_to(checkpoint)
        probe = toolchain.probe_engine_toolchain()
        found = shutil.which(argv[0])
        if found is None:
            raise EngineBuildFailed(f"{argv[0]} is not on PATH (tensorrt_llm {keyed_toolchain.get('tensorrt_llm')} "
                                    "is installed; its scripts folder must be on PATH)")
        command = [found, *argv[1:]]
    print(f"trtbuild: {engine_command.shell_line(argv)}", flush=True)
    started = time.monotonic()
    returncode, tail = run_logged(command, work)
    seconds = round(time.monotonic() - started, 2)
    if returncode != 0:
        last = tail[-1] if tail else "no output"
        raise EngineBuildFailed(f"{argv[0]} exited with status {returncode}: {last}")

    built = work / engine_command.OUTPUT_DIR
    problems = check_engine(built, checkpoint_config, params, probe.tensorrt_llm)
    if problems:
        raise EngineBuildFailed(f"the engine is not what was asked: {'; '.join(problems)}")
    for item in sorted(built.iterdir()):
        shutil.move(str(item), str(ctx.out / item.name))
    rank_bytes = max((ctx.out / f"rank{r}.engine").stat().st_size for r in range(world))
    timing_out = work / engine_command.TIMING_CACHE_OUT
    if timing_out.is_file() and runtime.timing_cache_out:
        destination = Path(runtime.timing_cache_out)
        destination.mkdir(parents=True, exist_ok=True)
        shutil.move(str(timing_out), str(destination / engine_command.TIMING_CACHE_OUT))

    mapping = checkpoint_config.get("mapping") or {}
    summary = EngineSummary(
        schema=1, kind="engine", sm=sm, tp=int(mapping.get("tp_size", 1)), pp=int(mapping.get("pp_size", 1)),
        world_size=world, quantization=_quantization(checkpoint_config),
        checkpoint=runtime.input_digests["checkpoint"],
        toolchain=EngineToolchainUsed(tensorrt_llm=probe.tensorrt_llm, tensorrt=probe.tensorrt, image=image),
        standin=probe.standin, command=argv, memory=EngineMemory(engine_bytes_per_rank=rank_bytes))
    ctx.report(summary, name="trtbuild.json")
    # recorded, never keyed: the same engine loads under any driver new enough for its CUDA
    ctx.measure(build_seconds=seconds, workers=workers, gpus=[g.name for g in gpus],
                timing_cache="reused" if timing_in else "new", cuda=probe.cuda, **hardware.driver_info())
