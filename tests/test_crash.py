"""Crash consistency: `trtbuild build`, `push` and `pull --dest` run as real processes on tiny
artifacts and killed with SIGKILL at seeded moments spread over the time the command writes.
After each kill the store verifies, no record or ref names a missing or partial object (local and
S3), `--dest` is absent or whole, and a re-run of the same command completes with the same digest
(and, for pull, leaves no hidden partial folder of --dest behind, the killed pull's included).
Each command is forked from a process that has done the imports already (ForkServer).

An uninterrupted run measures how long the command writes (from its first write, seen by polling:
the local store appearing, or the first object under the S3 prefix, to its exit). Trial i is
killed `window * (i + r) / TRIALS` seconds after its own first write, r drawn from
random.Random(seed), seed = TRTBUILD_CRASH_SEED * 1000 + i: a failure names its seed and moment.
A trial whose command exits before its moment is run again (fresh store and destination) at half
the moment, up to 8 times, so every trial's kill lands while the command writes (a machine slower
or faster than the measuring run only moves the moment).

The odd trials of pull are killed at a write point instead of a moment (SQLite's habit): the
forked command counts, with a Python audit hook, every file-system write it makes under --dest's
parent (open for writing, mkdir, rename, link, unlink, ...) and SIGKILLs itself just before write
point n, n = 1 + floor(M * (i + r) / TRIALS) of the M an uninterrupted run makes. Assembling --dest
takes a few milliseconds, which a kill timed by polling from outside hits only by luck.
Replay: TRTBUILD_CRASH_SEED=<s> TRTBUILD_CRASH_TRIALS=<n> pytest tests/test_crash.py -k <command>
(the window is measured on the host, so timed kills replay by seed, not by microsecond; write-point
kills replay exactly). The loops are marked `reliability` (run by default; `-m "not reliability"`
leaves them out).
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest
from click.testing import CliRunner

from test_transfer import Project, make_artifact, seaweed  # noqa: F401 (the module's SeaweedFS fixture)
from trtbuild.lock import lockfile
from trtbuild.lock.lockfile import LockedTarget
from trtbuild.cli import cli
from trtbuild.store.base import CorruptStore, Store
from trtbuild.store.local import LocalStore

SEED = int(os.environ.get("TRTBUILD_CRASH_SEED", "14"))
TRIALS = int(os.environ.get("TRTBUILD_CRASH_TRIALS", "50"))
TINY_HF = Path(__file__).resolve().parent / "data" / "nemo" / "hf_tiny_llama_tied_bf16"

pytestmark = pytest.mark.reliability


def moments(window: float) -> list[tuple[int, int, float]]:
    """(trial, seed, seconds after the first write to kill): one per slice of the window, placed at random."""
    return [(i, SEED * 1000 + i, window * (i + random.Random(SEED * 1000 + i).random()) / TRIALS)
            for i in range(TRIALS)]


# The killed commands are forked from one process that has imported what `python -m trtbuild` runs
# on (click, pydantic, botocore, boto3's transfer manager): each trial then starts in milliseconds,
# where an interpreter's start and those imports (0.3-1.2 s, writing nothing) were most of the
# file's time. From trtbuild.__main__.main on, the child is what `python -m trtbuild ARGS` is: its own
# argv, environment (TRTBUILD_CACHE, AWS_*), stdin/stdout/stderr on /dev/null, exit without teardown.
FORK_SERVER = r"""
import json, os, signal, sys
import botocore.session, boto3.s3.transfer
import trtbuild.__main__, trtbuild.cli, trtbuild.builder.pipeline, trtbuild.deploy.push, trtbuild.store.s3, trtbuild.store.transfer

# Audit events that change the file system (besides "open" for writing), and the arguments that are paths.
WRITES = {"os.mkdir": 1, "os.rename": 2, "os.remove": 1, "os.rmdir": 1, "os.link": 2, "os.symlink": 2,
          "shutil.copyfile": 2, "os.truncate": 1, "os.chmod": 1, "os.utime": 1}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def watch_writes(under, kill_at, count_to):
    # Count the writes under the folder `under` (its own mkdir included); write the count so far to
    # the file `count_to` (opened before the hook, so not counted), SIGKILL this process just before
    # write number `kill_at`.
    counted, out = 0, (os.open(count_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if count_to else None)

    def inside(path):
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False  # a descriptor
        path = os.path.abspath(os.fsdecode(path))
        return path == under or path.startswith(under + os.sep)

    def hook(event, args):
        nonlocal counted
        if event == "open":
            paths = args[:1] if args[2] & WRITE_FLAGS else ()
        else:
            paths = args[:WRITES.get(event, 0)]
        if any(inside(p) for p in paths):
            counted += 1
            if out is not None:
                os.pwrite(out, str(counted).encode().ljust(20), 0)
            if counted == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)


print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "wait":  # reaped only when asked: until then the pid stays this child's
        _, status = os.waitpid(request["pid"], 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
        continue
    pid = os.fork()
    if pid == 0:  # main() ends the process: os._exit, or a SystemExit out of this script (as under -m)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.environ.clear()
        os.environ.update(request["env"])
        if request.get("writes"):
            watch_writes(**request["writes"])
        sys.argv = ["trtbuild", *request["args"]]
        trtbuild.__main__.main()
    print(pid, flush=True)
"""


class ForkServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert self.proc.stdout.readline() == "ready\n"

    def ask(self, **request) -> int:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Forked:
    """A trtbuild command forked by the ForkServer, watched through a pidfd (it is not our child)."""

    def __init__(self, server: ForkServer, args: list[str], env: dict, writes: Optional[dict] = None) -> None:
        """`writes`: {"under": folder, "kill_at": n or None, "count_to": file or None} (FORK_SERVER's watch_writes)."""
        self.server = server
        self.pid = server.ask(op="run", args=[str(a) for a in args], writes=writes,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **env})
        self.pidfd = os.pidfd_open(self.pid)
        self.returncode = None

    def poll(self):
        if self.returncode is None and select.select([self.pidfd], [], [], 0)[0]:
            self.returncode = self.server.ask(op="wait", pid=self.pid)
            os.close(self.pidfd)
        return self.returncode

    def wait(self, timeout: float = 120) -> int:
        if self.returncode is None:
            select.select([self.pidfd], [], [], timeout)
        if self.poll() is None:
            raise TimeoutError(f"trtbuild (pid {self.pid}) still runs after {timeout}s")
        return self.returncode

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)  # still ours to kill: not reaped before wait() asks


@pytest.fixture(scope="module")
def fork_server():
    server = ForkServer()
    yield server
    server.close()


def test_a_forked_command_exits_as_python_m_trtbuild_does(fork_server, tmp_path):
    """The harness itself: exit status and effects of a forked command are those of the real one."""
    missing = tmp_path / "nowhere.yaml"
    ran = subprocess.run([sys.executable, "-m", "trtbuild", "build", missing], capture_output=True,
                         env={**os.environ, "TRTBUILD_CACHE": str(tmp_path / "s1")})
    assert ran.returncode == Forked(fork_server, ["build", missing], {"TRTBUILD_CACHE": str(tmp_path / "s2")}).wait() == 2
    recipe = tmp_path / "tiny.yaml"
    shutil.copytree(TINY_HF, tmp_path / "model")
    recipe.write_text(RECIPE)
    assert Forked(fork_server, ["build", recipe, "--until", "source"], {"TRTBUILD_CACHE": str(tmp_path / "s3")}).wait() == 0
    assert lockfile.read(recipe.with_suffix(".lock")).source["digest"] == LocalStore(tmp_path / "s3").read_ref(
        "tiny", "source").digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "s3", "tiny.lock", "tiny.yaml"]


def timed(server: ForkServer, args: list[str], env: dict, *wrote, poll: float = 0.002) -> list[float]:
    """An uninterrupted run (which must succeed): for each predicate, how long the run went on after
    it first held (start-up and imports write nothing: kills there would prove nothing)."""
    proc = Forked(server, args, env)
    first: list = [None] * len(wrote)
    while proc.poll() is None:
        for n, predicate in enumerate(wrote):
            if first[n] is None and predicate():
                first[n] = time.monotonic()
        time.sleep(poll)
    assert proc.wait() == 0, f"trtbuild {' '.join(map(str, args))} failed uninterrupted"
    assert None not in first, "the uninterrupted run was over before its first write was seen"
    end = time.monotonic()
    return [end - t for t in first]


def kill_at(server: ForkServer, args: list[str], env: dict, wrote, after: float, poll: float = 0.002) -> bool:
    """Start the command and SIGKILL it `after` seconds after `wrote()` first holds (asked every
    `poll` seconds); True when the kill landed (it was still running), False when it had already
    exited (it must have succeeded)."""
    proc = Forked(server, args, env)
    deadline = time.monotonic() + 120
    while proc.poll() is None and not wrote() and time.monotonic() < deadline:
        time.sleep(poll)
    seen = time.monotonic()
    while proc.poll() is None and time.monotonic() - seen < after:
        time.sleep(0.002)
    if proc.poll() is not None:
        assert proc.returncode == 0, f"exited {proc.returncode} before the kill"
        return False
    proc.kill()
    proc.wait()
    return True


RERUNS = 8


def until_killed(attempt: Callable[[float], bool], after: float, at: str) -> int:
    """Call `attempt(moment)` (run the command afresh and kill it `moment` seconds after its first
    write: True when the kill landed) at `after`, then at half of it, and so on, until a kill lands
    while the command runs. Returns how many runs finished before their moment; fails after RERUNS."""
    for early in range(RERUNS):
        if attempt(after / 2 ** early):
            return early
    raise AssertionError(f"{at}: finished before its kill {RERUNS} times, the last time "
                         f"{after / 2 ** (RERUNS - 1):.4f}s after its first write")


def count_writes(server: ForkServer, args: list[str], env: dict, under: Path, count_to: Path) -> int:
    """An uninterrupted run (which must succeed): how many file-system writes it makes under `under`."""
    proc = Forked(server, args, env, writes={"under": str(under), "kill_at": None, "count_to": str(count_to)})
    assert proc.wait() == 0, f"trtbuild {' '.join(map(str, args))} failed uninterrupted"
    return int(count_to.read_text())


def kill_at_write(server: ForkServer, args: list[str], env: dict, under: Path, write: int) -> None:
    """Run the command and SIGKILL it just before its write number `write` under `under`."""
    proc = Forked(server, args, env, writes={"under": str(under), "kill_at": write, "count_to": None})
    assert proc.wait() == -signal.SIGKILL, f"exited {proc.returncode} before its write {write} under {under}"


def cli_run(args: list[str], env: dict):
    """The same command again, in this process (the re-run after a crash; no interpreter start)."""
    return CliRunner(env=env).invoke(cli, [str(a) for a in args], catch_exceptions=False)


def dangling(store: Store) -> list[str]:
    """Records and refs that name an artifact whose manifest is missing or bad, or one of whose
    blobs is missing or of the wrong size (a partial object)."""
    sizes = dict(store.iter_blobs())
    problems, known = [], {}  # known: digest -> why it is not whole ("" when it is), each read once

    def check(what: str, digest: str) -> None:
        if digest not in known:
            try:
                manifest = store.get_manifest(digest)
                known[digest] = next((f"blob {e.sha256} ({e.path}) has {sizes.get(e.sha256, 'no')} bytes, its "
                                      f"manifest says {e.size}" for e in manifest.entries
                                      if sizes.get(e.sha256) != e.size), "")
            except CorruptStore as exc:
                known[digest] = str(exc)
        if known[digest]:
            problems.append(f"{what} -> {digest}: {known[digest]}")

    for key in store.record_keys():
        record = store.get_record(key)  # a record that does not parse raises: also a failure
        if record is not None:
            check(f"record {key}", record.digest)
    for recipe, target, ref in store.refs():
        check(f"ref {recipe}/{target}", ref.digest)
        for entry in ref.history:
            check(f"ref {recipe}/{target} history", entry.digest)
    return problems


def opened(url: str) -> Store:
    """The store at `url`, opened once per trial for all its checks (an S3 store's client takes
    0.1-0.2 s to make)."""
    from trtbuild.store.local import open_store

    return open_store(url, create=True)


def store_is_sound(store: Store, env: dict) -> list[str]:
    """`trtbuild cache verify` clean (or no store at all, when the kill came before its first
    write), and nothing dangling. Problems as lines; empty when sound."""
    if not store.exists():
        return []
    result = cli_run(["cache", "verify", "--store", store.location], env)
    clean = (0, f"store {store.location}: every blob, manifest, record and ref checks out\n", "")
    lines = [] if (result.exit_code, result.stdout, result.stderr) == clean else [
        f"cache verify exited {result.exit_code}: {result.stdout.strip()} {result.stderr.strip()}"]
    return lines + dangling(store)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def left_at(store: Store) -> str:
    """How far the killed command got in the store: the last kind of object it holds, in write order."""
    if not store.exists():
        return "no store (or its layout half made)"
    kinds = [("blobs", lambda: next(iter(store.iter_blobs()), None)), ("manifests", store.manifest_digests),
             ("records", store.record_keys), ("refs", lambda: next(iter(store.refs()), None))]
    present = [name for name, listed in kinds if listed()]
    return present[-1] if present else "layout only"


def report(command: str, reruns: int, states: dict, note: str = "") -> None:
    """A line for benchmarks/RESULTS.md (seen with -s): the trials (each killed mid-run), the runs
    that finished before their moment and were run again earlier, and where the kills left the store."""
    print(f"crash[{command}]: {TRIALS} trials (seed base {SEED}), each killed mid-run ({reruns} runs finished "
          f"before their moment and were run again earlier), all survived; left at: {dict(sorted(states.items()))}{note}")


def where(command: str, i: int, seed: int, after: float, window: float) -> str:
    return (f"{command} trial {i}: seed {seed} (TRTBUILD_CRASH_SEED={SEED}), SIGKILL {after:.3f}s after its first "
            f"write (an uninterrupted run wrote for {window:.3f}s)")


# ---- build ---------------------------------------------------------------------------------------

RECIPE = """schema: 1
name: tiny
source: {path: model}
variants: {bf16: {}}
gpus: [sm90]
backends: [hf-checkpoint]
"""


def test_build_killed_at_random_moments(tmp_path, fork_server):
    """`build --until source` ingests the model (6 files, 0.3 MB): blobs, manifest, record, ref,
    checkout and the lock file. Each trial builds into a fresh store."""
    model = tmp_path / "model"
    shutil.copytree(TINY_HF, model)
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(RECIPE)
    args = ["build", recipe, "--until", "source", "--json"]
    base_env = {"TRTBUILD_CACHE": str(tmp_path / "baseline")}
    [window] = timed(fork_server, args, base_env, lambda: (tmp_path / "baseline").exists())
    expected = lockfile.read(recipe.with_suffix(".lock")).source["digest"]
    reruns, states = 0, {}
    for i, seed, after in moments(window):
        store = tmp_path / f"store{i}"
        env = {"TRTBUILD_CACHE": str(store)}
        at = where("build", i, seed, after, window)

        def attempt(moment: float) -> bool:
            shutil.rmtree(store, ignore_errors=True)
            recipe.with_suffix(".lock").unlink(missing_ok=True)
            return kill_at(fork_server, args, env, store.exists, moment)

        reruns += until_killed(attempt, after, at)
        opened_store = opened(str(store))
        state = left_at(opened_store)
        states[state] = states.get(state, 0) + 1
        assert store_is_sound(opened_store, env) == [], at
        if recipe.with_suffix(".lock").exists():  # a lock that is there is whole
            assert lockfile.read(recipe.with_suffix(".lock")).source["digest"] == expected, at
        again = cli_run(args, env)
        assert again.exit_code == 0, f"{at}: re-run failed: {again.stderr}"
        source = next(t for t in json.loads(again.stdout)["targets"] if t["name"] == "source")
        assert (source["status"] in ("built", "cached"), source["digest"]) == (True, expected), at
        assert store_is_sound(opened(str(store)), env) == [], at
        shutil.rmtree(store)
    report("build", reruns, states)


# ---- push and pull through S3 --------------------------------------------------------------------

@pytest.fixture
def bucket(seaweed, monkeypatch, request):
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    seaweed.client().create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture
def published(ws, tmp_path, monkeypatch):
    """A lock of a validated checkpoint (3 small files) and its validation in a local store."""
    project = Project(ws, tmp_path, monkeypatch)
    for target in ("base-tp1",):
        project.add(target)
        project.add(f"{target}:validate", "validate", gates_passed=True)
    project.write_lock()
    return project


def test_push_killed_at_random_moments(published, bucket, seaweed, fork_server):
    """Each trial pushes to a fresh prefix of the bucket (blobs, manifests, records, the lock, refs)."""
    env = {"TRTBUILD_CACHE": str(published.local.root)}
    digests = {t: published.targets[t].digest for t in ("base-tp1", "base-tp1:validate")}
    name = bucket[len("s3://"):]
    client = seaweed.client()

    def wrote(prefix: str):
        return lambda: client.list_objects_v2(Bucket=name, Prefix=f"{prefix}/", MaxKeys=1)["KeyCount"] > 0

    # each look is a request: asked every 10 ms, not to take the CPU from the push it watches
    [window] = timed(fork_server, ["push", published.recipe, "--store", f"{bucket}/baseline"], env, wrote("baseline"), poll=0.01)
    reruns, states = 0, {}
    for i, seed, after in moments(window):
        at = where("push", i, seed, after, window)
        runs = []  # each run pushes to a fresh prefix: the last is the one killed

        def attempt(moment: float) -> bool:
            runs.append(f"trial{i}" + (f"-{len(runs)}" if runs else ""))
            return kill_at(fork_server, ["push", published.recipe, "--store", f"{bucket}/{runs[-1]}"], env,
                           wrote(runs[-1]), moment, poll=0.01)

        reruns += until_killed(attempt, after, at)
        url = f"{bucket}/{runs[-1]}"
        args = ["push", published.recipe, "--store", url]
        remote = opened(url)
        state = left_at(remote)
        states[state] = states.get(state, 0) + 1
        assert store_is_sound(remote, env) == [], at
        assert published.local.artifact_problem(digests["base-tp1"]) is None, at  # push only reads the local store
        again = cli_run(args, env)
        assert (again.exit_code, again.stderr) == (0, ""), at
        assert {t: remote.read_ref("tiny", t).digest for t in digests} == digests, at
    assert store_is_sound(opened(url), env) == [], "after the last re-run"  # (each trial's re-run is checked by its refs)
    report("push", reruns, states)


# 16 files of 64 bytes in 2 folders: assembling --dest is dozens of write points to kill at
WIDE = {f"shard{n // 8}/part{n:02d}.bin": bytes([n]) * 64 for n in range(16)}


def test_pull_dest_killed_at_random_moments(published, bucket, tmp_path, fork_server):
    """Each trial pulls wide-tp1 (WIDE) into a fresh local store and a fresh --dest."""
    record = make_artifact(published.local, tmp_path / "art" / "wide", WIDE, "wide-tp1", 90)
    published.targets["wide-tp1"] = LockedTarget(stage="checkpoint", key=record.key, digest=record.digest,
                                                 size=record.size)
    published.add("wide-tp1:validate", "validate", gates_passed=True)
    published.write_lock()
    url = f"{bucket}/team"
    pushed = cli_run(["push", published.recipe, "--store", url], {"TRTBUILD_CACHE": str(published.local.root)})
    assert pushed.exit_code == 0, pushed.stderr
    digest = record.digest

    def args(dest: Path) -> list:
        return ["pull", published.lock_path, "--target", "wide-tp1", "--store", url, "--dest", dest]

    # Even trials are killed at moments spread over the whole pull (from the local store's first
    # write), odd ones at a write point under --dest's parent: materialize_to assembles --dest in a
    # few milliseconds at the end, which kills at moments would hardly ever hit.
    baseline_store = tmp_path / "baseline-store"
    [window] = timed(fork_server, args(tmp_path / "baseline" / "wide-tp1"), {"TRTBUILD_CACHE": str(baseline_store)},
                     baseline_store.exists)
    writes = count_writes(fork_server, args(tmp_path / "counted" / "wide-tp1"),
                          {"TRTBUILD_CACHE": str(tmp_path / "counted-store")}, tmp_path / "counted",
                          tmp_path / "writes")
    assert writes >= 2 + len(WIDE), f"assembling --dest made {writes} writes"  # its folder, each file, the rename
    reruns, states = 0, {}
    for i, seed, after in moments(window):
        store, dest = tmp_path / f"deploy{i}", tmp_path / f"serve{i}" / "wide-tp1"
        env = {"TRTBUILD_CACHE": str(store)}
        if i % 2:
            write = 1 + int(writes * (i + random.Random(seed).random()) / TRIALS)
            at = f"pull trial {i}: seed {seed} (TRTBUILD_CRASH_SEED={SEED}), SIGKILL before write {write} of {writes} under {dest.parent}"
            kill_at_write(fork_server, args(dest), env, dest.parent, write)
        else:
            at = where("pull", i, seed, after, window)

            def attempt(moment: float) -> bool:
                shutil.rmtree(store, ignore_errors=True)
                shutil.rmtree(dest.parent, ignore_errors=True)
                return kill_at(fork_server, args(dest), env, store.exists, moment)

            reruns += until_killed(attempt, after, at)
        state = "dest whole" if dest.exists() else left_at(opened(str(store)))
        states[state] = states.get(state, 0) + 1
        partial = [p for p in dest.parent.glob(f".{dest.name}.partial-*") if p.is_dir()] if dest.parent.exists() else []
        states["partial folders left beside --dest"] = states.get("partial folders left beside --dest", 0) + len(partial)
        if dest.exists():
            assert folder_bytes(dest) == WIDE, f"{at}: --dest exists but is not whole"
        assert store_is_sound(opened(str(store)), env) == [], at
        again = cli_run(args(dest), env)
        assert (again.exit_code, again.stdout, again.stderr) == (0, f"{dest}\n", ""), at
        assert folder_bytes(dest) == WIDE, at
        assert list(dest.parent.glob(f".{dest.name}.partial-*")) == [], f"{at}: the re-run left partial folders"
        assert LocalStore(store).get_record(record.key).digest == digest, at
        assert store_is_sound(opened(str(store)), env) == [], at
        shutil.rmtree(store)
        shutil.rmtree(dest.parent)
    report("pull", reruns, states, f"; an uninterrupted pull writes {writes} times under --dest's parent")
