"""What a newcomer runs into, said in one line each (issue #23, items 5 and 6): a hub that cannot be
reached, Ctrl-C, and what used to happen silently (a damaged artifact rebuilt, a wait for another
build's lock, a mistyped --store starting an empty store). Each command runs as a real process."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from hubserver import HubServer
from tinymodels import make_model, make_tokenizer

RECIPE = "schema: 1\nname: tiny\nsource: {path: model}\ngpus: [sm90]\nlimits: {max_input_len: 128, max_seq_len: 256}\n"
HUB_RECIPE = ("schema: 1\nname: hub-tiny\nsource: {{hf: org/tiny-llama, revision: main{extra}}}\ngpus: [sm90]\n"
              "limits: {{max_input_len: 128, max_seq_len: 256}}\n")
INTERRUPTED = ("interrupted; nothing half-written: what was finished is kept, the rest was discarded "
               "(run the command again to go on)")
# a build's progress line on a pipe (progress.ConsoleReporter.finished)
PROGRESS = re.compile(r" *(built|cached|skipped|failed|impossible) \S+ \(.*")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    return make_model(folder / "model", "llama", make_tokenizer(folder / "tokenizer"))


@pytest.fixture
def project(tmp_path, model) -> Path:
    (tmp_path / "model").symlink_to(model)
    (tmp_path / "tiny.yaml").write_text(RECIPE)
    (tmp_path / "config.json").write_bytes((model / "config.json").read_bytes())
    return tmp_path


def env_for(project: Path, **extra: str) -> dict:
    env = {**os.environ, "TRTBUILD_CACHE": str(project / "store"), **extra}
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        env.pop(name, None)
    return env


def trtbuild(project: Path, *args, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtbuild", *map(str, args)], capture_output=True, text=True,
                          cwd=project, env=env_for(project, **extra), timeout=600)


def tree(folder: Path) -> dict:
    """Every path under `folder` with its bytes (None for a folder); SQLite's shared-memory index of
    the write-ahead log, which any reader rewrites, left out."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(folder.rglob("*")) if p.name != "index.db-shm"}


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ---- a hub that cannot be reached ------------------------------------------------------------------

def unreachable(where: str, endpoint: str) -> str:
    return (f"{where}: source.hf: org/tiny-llama@main: cannot reach {endpoint} (connection refused); build where the "
            "hub is reachable, set HF_ENDPOINT to a mirror, or set HF_HUB_OFFLINE=1 to build from the Hugging Face "
            "cache and the lock file\n")


def test_a_hub_that_refuses_connections_is_one_line_and_leaves_no_store(project):
    """source.config lets the plan pass; the source's listing then meets the closed port."""
    (project / "hub.yaml").write_text(HUB_RECIPE.format(extra=", config: config.json"))
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result = trtbuild(project, "build", "hub.yaml", HF_ENDPOINT=endpoint, HF_HOME=str(project / "hf"))
    assert (result.returncode, result.stdout, result.stderr) == (1, "", unreachable("hub.yaml:3:14", endpoint))
    assert not (project / "store").exists()


def test_a_hub_that_cannot_be_reached_leaves_an_existing_store_as_it_was(project):
    built = trtbuild(project, "build", "tiny.yaml", "--until", "source")
    assert built.returncode == 0, built.stderr
    before = tree(project / "store")
    (project / "hub.yaml").write_text(HUB_RECIPE.format(extra=", config: config.json"))
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result = trtbuild(project, "build", "hub.yaml", "--json", HF_ENDPOINT=endpoint, HF_HOME=str(project / "hf"))
    assert (result.returncode, result.stdout, result.stderr) == (1, "", unreachable("hub.yaml:3:14", endpoint))
    assert tree(project / "store") == before  # no claim of the name hub-tiny, nothing else
    assert not (project / "store" / "refs" / "hub-tiny").exists()


def test_a_stopped_hub_while_planning_is_one_line(project):
    """Without source.config the plan downloads config.json, which huggingface_hub retries (and
    logged twice a retry, urllib3's repr each time): one line, after its retries."""
    hub = HubServer({}).start()
    endpoint = hub.url
    hub.stop()
    (project / "hub.yaml").write_text(HUB_RECIPE.format(extra=""))
    result = trtbuild(project, "build", "hub.yaml", HF_ENDPOINT=endpoint, HF_HOME=str(project / "hf"))
    assert (result.returncode, result.stdout, result.stderr) == (1, "", unreachable("hub.yaml:3:14", endpoint))
    assert not (project / "store").exists()


# ---- Ctrl-C ----------------------------------------------------------------------------------------

def sigint_as_at_a_terminal() -> None:
    """preexec_fn: SIGINT's default disposition in the command, as a terminal's shell gives it. A
    test session started in the background of a script (`cmd &`) runs with SIGINT ignored, every
    child inherits that, and trtbuild rightly leaves an ignored SIGINT ignored (interrupt.install)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_lines_until(proc: subprocess.Popen, done, seconds: float = 300) -> list[str]:
    """stderr lines of `proc` until `done(lines)` (checked between lines and every 20 ms)."""
    lines, buffer = [], b""
    fd = proc.stderr.fileno()
    for _ in range(int(seconds / 0.02)):
        if done(lines):
            return lines
        ready, _, _ = select.select([fd], [], [], 0.02)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"the command ended first: {lines}"
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines += [line.decode() for line in complete]
    raise AssertionError(f"not seen in time: {lines}")


def a_stage_at_work(store: Path):
    """Whether a stage after the source (a torch stage, in the shared worker) has its folder in tmp/."""
    return lambda lines: any(p.is_dir() and not p.name.startswith("source-") for p in (store / "tmp").glob("*"))


def test_ctrl_c_during_a_build_exits_130_with_one_line_and_nothing_half_written(project):
    store = project / "store"
    proc = subprocess.Popen([sys.executable, "-m", "trtbuild", "build", "tiny.yaml"], cwd=project,
                            env=env_for(project), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True,  # its own process group: a terminal's Ctrl-C reaches them all
                            preexec_fn=sigint_as_at_a_terminal)
    try:
        before = read_lines_until(proc, a_stage_at_work(store))
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = before + err.decode().splitlines()
    assert proc.returncode == 130, "\n".join(lines)
    assert lines[-1] == INTERRUPTED and out == b""
    assert [line for line in lines[:-1] if line != f"new store at {store}" and not PROGRESS.fullmatch(line)] == []
    assert not any(line.lstrip().startswith("failed") for line in lines)  # the stage at work was not a failure
    with pytest.raises(ProcessLookupError):  # no stage process left behind
        os.killpg(proc.pid, 0)
    assert list((store / "tmp").iterdir()) == [] and not (store / "failed").exists()
    verify = trtbuild(project, "cache", "verify")
    assert (verify.returncode, verify.stderr) == (0, ""), verify.stderr
    assert verify.stdout == f"store {store}: every blob, manifest, record and ref checks out\n"


# Interrupts the command at its first file-system write under PATH (an audit hook), as Ctrl-C would
# at that moment: the handler runs before the write's next bytecode.
SELF_INTERRUPT = r"""
import os, signal, sys
under = os.path.abspath(sys.argv.pop(1))
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and args[2] & (os.O_WRONLY | os.O_RDWR) \
            and os.path.abspath(os.fsdecode(args[0])).startswith(under + os.sep):
        signal.raise_signal(signal.SIGINT)
sys.addaudithook(hook)
sys.argv[0] = "trtbuild"
from trtbuild.cli.entry import main
main()
"""


def interrupted(project: Path, under: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SELF_INTERRUPT, str(under), *map(str, args)], capture_output=True,
                          text=True, cwd=project, env=env_for(project), timeout=600, preexec_fn=sigint_as_at_a_terminal)


@pytest.fixture
def built(project) -> Path:
    done = trtbuild(project, "build", "tiny.yaml", "--until", "source")
    assert done.returncode == 0, done.stderr
    return project


@pytest.fixture
def checkpoint(project) -> Path:
    """A target to push: the model's hf-checkpoint, validated by torch (seconds on a CPU)."""
    (project / "tiny.yaml").write_text(RECIPE + "backends: [hf-checkpoint]\n")
    done = trtbuild(project, "build", "tiny.yaml")
    assert done.returncode == 0, done.stderr
    return project


def test_ctrl_c_during_a_push_exits_130_with_one_line_and_the_store_verifies(checkpoint):
    shared = checkpoint / "shared"
    shared.mkdir()  # an existing folder: the push writes into it (no "new store" line)
    result = interrupted(checkpoint, shared / "tmp", "push", "tiny.yaml", "--store", shared)  # at its first blob
    assert (result.returncode, result.stdout, result.stderr) == (130, "", INTERRUPTED + "\n")
    # stopped before anything was stored there: the folder is as it was, empty (no store skeleton, no
    # claim of the recipe's name: push claims it only once the artifacts are there, before the first ref)
    assert list(shared.iterdir()) == []


def test_ctrl_c_during_a_pull_exits_130_with_one_line_and_no_dest(checkpoint):
    pushed = trtbuild(checkpoint, "push", "tiny.yaml", "--store", checkpoint / "shared")
    assert pushed.returncode == 0, pushed.stderr
    dest = checkpoint / "served"
    result = interrupted(checkpoint, checkpoint, "pull", "tiny.yaml", "--store", checkpoint / "shared", "--target",
                         "base-hf", "--dest", dest)
    assert (result.returncode, result.stdout, result.stderr) == (130, "", INTERRUPTED + "\n")
    assert not dest.exists() and not list(checkpoint.glob(".served.partial-*"))
    verify = trtbuild(checkpoint, "cache", "verify")
    assert verify.returncode == 0, verify.stderr



# Ctrl-C the moment a work folder exists, before the code that made it has returned (mkdtemp and
# Path.mkdir call os.mkdir): the folder must still go. This is the window between a work folder's
# mkdir and the guard that removes it.
INTERRUPT_AFTER_MKDIR = r"""
import os, signal, sys
wanted = sys.argv.pop(1)
mkdir = os.mkdir
def mkdir_then_ctrl_c(path, *args, **kwargs):
    mkdir(path, *args, **kwargs)
    if os.path.basename(os.fspath(path)).startswith(wanted):
        signal.raise_signal(signal.SIGINT)  # its handler runs before this call returns
os.mkdir = mkdir_then_ctrl_c
sys.argv[0] = "trtbuild"
from trtbuild.cli.entry import main
main()
"""


def interrupted_after_mkdir(project: Path, prefix: str, *args, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", INTERRUPT_AFTER_MKDIR, prefix, *map(str, args)],
                          capture_output=True, text=True, cwd=project, env=env_for(project, **extra), timeout=600,
                          preexec_fn=sigint_as_at_a_terminal)


def test_ctrl_c_as_a_push_staging_folder_is_made_leaves_nothing_in_tmp(checkpoint):
    result = interrupted_after_mkdir(checkpoint, "push-", "push", "tiny.yaml", "--store", checkpoint / "shared")
    assert (result.returncode, result.stdout, result.stderr) == (130, "", INTERRUPTED + "\n")
    assert list((checkpoint / "store" / "tmp").iterdir()) == []


@pytest.mark.parametrize("folder", ["pull-", "checkout-"])
def test_ctrl_c_as_a_pull_makes_a_work_folder_leaves_nothing_in_tmp(checkpoint, folder):
    shared, local = checkpoint / "shared", checkpoint / "local"
    pushed = trtbuild(checkpoint, "push", "tiny.yaml", "--store", shared)
    assert pushed.returncode == 0, pushed.stderr
    pull = ("pull", "tiny.yaml", "--store", shared, "--target", "base-hf")
    first = trtbuild(checkpoint, *pull, TRTBUILD_CACHE=str(local))  # a store that exists (a new one is dropped whole)
    assert first.returncode == 0, first.stderr
    shutil.rmtree(local / "checkouts")  # so the next pull makes its checkout again
    result = interrupted_after_mkdir(checkpoint, folder, *pull, TRTBUILD_CACHE=str(local))
    assert (result.returncode, result.stdout, result.stderr) == (130, "", INTERRUPTED + "\n")
    assert list((local / "tmp").iterdir()) == []
    verify = trtbuild(checkpoint, "cache", "verify", TRTBUILD_CACHE=str(local))
    assert (verify.returncode, verify.stderr) == (0, ""), verify.stderr


def test_ctrl_c_as_a_pull_makes_its_dest_folder_leaves_no_partial(checkpoint):
    pushed = trtbuild(checkpoint, "push", "tiny.yaml", "--store", checkpoint / "shared")
    assert pushed.returncode == 0, pushed.stderr
    result = interrupted_after_mkdir(checkpoint, ".served.partial-", "pull", "tiny.yaml", "--store",
                                     checkpoint / "shared", "--target", "base-hf", "--dest", checkpoint / "served")
    assert (result.returncode, result.stdout, result.stderr) == (130, "", INTERRUPTED + "\n")
    assert not (checkpoint / "served").exists() and not list(checkpoint.glob(".served.partial-*"))


# ---- what used to be silent ----------------------------------------------------------------------

def source_record(project: Path) -> dict:
    store = project / "store"
    ref = json.loads((store / "refs" / "tiny" / "source").read_text())
    return {"key": ref["key"], "digest": ref["digest"],
            "manifest": json.loads((store / "manifests" / f"{ref['digest']}.json").read_text())}


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_rebuild_after_a_damaged_blob_says_so_naming_the_target_and_the_blob(built, damage):
    store = built / "store"
    found = source_record(built)
    entry = next(e for e in found["manifest"] if e["path"] == "config.json")
    blob = store / "cas" / "sha256" / entry["sha256"][:2] / entry["sha256"]
    if damage == "missing":
        blob.unlink()
        problem = f"blob {entry['sha256']} (config.json) is missing from {store / 'cas'}"
    else:
        blob.chmod(0o644)
        data = bytearray(blob.read_bytes())
        data[0] ^= 1
        blob.write_bytes(bytes(data))
        import hashlib

        problem = f"blob {blob} is corrupt: its sha256 is {hashlib.sha256(data).hexdigest()}; run `trtbuild cache verify`"
    result = trtbuild(built, "build", "tiny.yaml", "--until", "source", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["targets"][0]["status"] == "built"  # stdout stays JSON
    notes = [line for line in result.stderr.splitlines() if not PROGRESS.fullmatch(line)]
    assert notes == [f"source: rebuilding {found['digest'][:12]}: the stored artifact is damaged ({problem})"]


def waiting_build(project: Path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "trtbuild", "build", "tiny.yaml", "--until", "source", *args],
                            cwd=project, env=env_for(project), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def this_process() -> str:
    command = " ".join(Path("/proc/self/cmdline").read_bytes().decode().split("\0")).strip()
    return f"pid {os.getpid()} ({command[:77] + '...' if len(command) > 80 else command})"


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="the kernel's lock table names the holder (Linux)")
def test_a_build_waiting_for_another_builds_key_says_so_naming_the_lock_and_its_holder(built):
    store = built / "store"
    key = source_record(built)["key"]
    (store / "ac" / f"{key}.json").unlink()  # the next build must make the source again
    lock_file = store / "locks" / f"{key}.lock"
    lock = FileLock(str(lock_file))
    lock.acquire()  # as another build making this key holds it
    proc = waiting_build(built)
    try:
        lines = read_lines_until(proc, lambda lines: any("waiting" in line for line in lines))
    finally:
        lock.release()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    lines += err.decode().splitlines()
    notes = [line for line in lines if not PROGRESS.fullmatch(line)]
    assert notes == [f"source: waiting for {lock_file}, held by {this_process()}"]


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="the kernel's lock table names the holder (Linux)")
def test_a_build_waiting_for_the_store_says_so_naming_the_lock_and_its_holder(built):
    store = built / "store"
    lock_file = store / "locks" / "store.lock"
    with open(lock_file, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as `cache gc` holds it
        proc = waiting_build(built, "--json")
        lines = read_lines_until(proc, lambda lines: any("waiting" in line for line in lines))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["targets"][0]["status"] == "cached"
    notes = [line for line in lines + err.decode().splitlines() if not PROGRESS.fullmatch(line)]
    assert notes == [f"store {store}: waiting for {lock_file}, held by {this_process()}"]


def test_a_build_into_a_folder_that_was_not_there_says_new_store(project):
    typo = project / "cahce"
    result = trtbuild(project, "build", "tiny.yaml", "--until", "source", "--store", typo, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["targets"][0]["status"] == "built"
    assert [line for line in result.stderr.splitlines() if not PROGRESS.fullmatch(line)] == [f"new store at {typo}"]
    again = trtbuild(project, "build", "tiny.yaml", "--until", "source", "--store", typo)
    assert again.returncode == 0 and "new store" not in again.stderr
    empty = project / "empty"
    empty.mkdir()  # a folder made for it: no typo
    made = trtbuild(project, "build", "tiny.yaml", "--until", "source", "--store", empty)
    assert made.returncode == 0 and "new store" not in made.stderr
