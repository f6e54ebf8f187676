"""A no-op build, replayed: `trtbuild build` run again with nothing changed writes what the last
no-op run wrote, without importing the planner, the records, pydantic or click (issue #15: a fully
cached build's start-up).

A `trtbuild build` run as a command (not through `--json`, `--push`, `--rebuild` or `--lock-out`,
without a remote store, on a file or pipe) that builds nothing and fails nothing records what it
depended on, in <store>/replay/<digest of the command line and working folder>.json:

- the command line, working folder, interpreter, `sys.path` and the environment (all of it but
  the shell's own bookkeeping, VOLATILE_ENV);
- every file it opened and every folder it listed (an audit hook: the recipe, the lock file, refs,
  claims, action records, manifests, package metadata, the folders on `sys.path`), every path it
  decided on with a stat alone (which the code names with the audit event STAT_EVENT: the `.git`
  folders that place a recipe in its work tree), every file whose stat the store's stat cache
  vouched for (each blob of each artifact, a source's files), and the source of every module it
  imported: each with its device, inode, size, mtime and ctime, or its absence;
- what the GPU probes found (NVML), which the replay probes again;
- what it wrote to stdout and stderr, and its exit status (0).

The next run of the same command replays that output only when every one of those is as it was. A
write moves a file's mtime and ctime, and no user can set a ctime back (the stat cache's argument,
store/state.py): a blob deleted, rewritten or replaced, a recipe or a module edited, a package
installed, a ref or the lock file touched, a GPU added, and the build runs in full, as it does when
the record is missing, unreadable or of another schema. The full run records afresh. A run that
started a process or opened a socket records nothing: what those answered is not a file's stat.
This is make's and ninja's bargain (a stat says whether an input changed) made stricter by the
ctime; it never answers for a store whose files it cannot see unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Optional

SCHEMA = 1
FOLDER = "replay"
# The shell's bookkeeping, which differs between two runs of one command; the rest of the
# environment must be the same.
VOLATILE_ENV = frozenset({"_", "OLDPWD", "SHLVL"})
# Files whose stat says nothing about their content (the kernel's views), and events whose answer is
# not in a file: a run with one of the latter records nothing.
_NOT_FILES = ("/proc/", "/sys/", "/dev/")
_UNRECORDABLE = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty",
                           "socket.connect", "pty.spawn"})

# Code that decides on a stat alone (no open, no listing) names the path with this event,
# sys.audit(STAT_EVENT, path), so that the path is an input of the record too.
STAT_EVENT = "trtbuild.stat"

_armed: Optional["Recorder"] = None


# ---- what a run is, apart from its files -------------------------------------------------------

def _identity(argv: list[str]) -> dict:
    env = sorted((k, v) for k, v in os.environ.items() if k not in VOLATILE_ENV)
    return {"argv": list(argv), "cwd": os.getcwd(), "executable": sys.executable, "python": sys.version,
            "path": list(sys.path), "env": hashlib.sha256(json.dumps(env).encode()).hexdigest()}


def _record_path(argv: list[str]) -> Optional[str]:
    """Where the record of this command line is: in the store it names (a folder; none for s3://)."""
    from trtbuild.store.location import store_url

    url = None
    for i, arg in enumerate(argv):  # click's two spellings; a wrong guess only misses (identity is checked)
        if arg == "--":
            break
        if arg == "--store" and i + 1 < len(argv):
            url = argv[i + 1]
        elif arg.startswith("--store="):
            url = arg[len("--store="):]
    url = store_url(url)
    if "://" in url:
        return None
    name = hashlib.sha256(json.dumps([argv, os.getcwd()]).encode()).hexdigest()[:32]
    return os.path.join(os.path.abspath(url), FOLDER, f"{name}.json")


def _stat(path: str) -> Optional[list[int]]:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _probes(which: list[str]) -> dict:
    """What NVML says now, for the probes the recorded run made (trtbuild.hardware, cached per process)."""
    from trtbuild import hardware

    found: dict = {}
    if "gpus" in which:
        found["gpus"] = [[g.index, g.name, g.sm, g.memory_bytes] for g in hardware.detect_gpus()]
    if "driver" in which:
        found["driver"] = hardware.driver_info()
    return found


def _plain_streams() -> bool:
    from trtbuild import plainout

    return plainout.plain_stream(sys.stdout) and plainout.plain_stream(sys.stderr)


# ---- replaying ---------------------------------------------------------------------------------

def replay(argv: list[str]) -> Optional[int]:
    """Write the recorded output of this no-op build and return its exit status, or None (having
    written nothing) when there is no record or anything it depended on changed."""
    try:
        record = _matching_record(argv)
    except Exception:  # unreadable, damaged, a probe that broke: the build runs in full and says why
        return None
    if record is None:
        return None
    sys.stderr.write(record["stderr"])
    sys.stderr.flush()
    sys.stdout.write(record["stdout"])
    sys.stdout.flush()
    return record["exit_code"]


def _matching_record(argv: list[str]) -> Optional[dict]:
    path = _record_path(argv)
    if path is None or not _plain_streams():
        return None
    try:
        with open(path, "rb") as f:
            record = json.loads(f.read())
    except FileNotFoundError:
        return None
    if record.get("schema") != SCHEMA or record["identity"] != _identity(argv):
        return None
    if any(_stat(file) != recorded for file, recorded in record["files"]):
        return None
    if record["probes"] and _probes(list(record["probes"])) != record["probes"]:
        return None
    if not (isinstance(record["stdout"], str) and isinstance(record["stderr"], str) and record["exit_code"] == 0):
        return None
    return record


# ---- recording ---------------------------------------------------------------------------------

class _Tee:
    """sys.stdout or sys.stderr, keeping a copy of the text written through it."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.written: list[str] = []

    def write(self, text: str) -> int:
        written = self._stream.write(text)  # first: what the stream refuses (click probes with b"") is not kept
        self.written.append(text)
        return written

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class Recorder:
    """Collects the files a run opens and the folders it lists (sys.addaudithook: it cannot be
    removed, so it stops collecting once the run cannot be recorded), and what it writes to
    sys.stdout and sys.stderr."""

    def __init__(self, argv: list[str], path: str) -> None:
        self.path = path
        self.identity = _identity(argv)  # as the run began: it may set variables of its own
        self.paths: set[str] = set()
        self.recordable = True
        sys.stdout, sys.stderr = self.stdout, self.stderr = _Tee(sys.stdout), _Tee(sys.stderr)
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if not self.recordable:
            return
        if event in ("open", "os.listdir", "os.scandir", STAT_EVENT):
            try:
                path = args[0]
                if path is None:  # os.listdir() / os.scandir(): the working folder
                    path = "."
                if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
                    self.paths.add(os.path.abspath(os.fsdecode(path)))
            except Exception:  # an audit hook that raises fails the call it audits: never
                pass
        elif event in _UNRECORDABLE:
            self.recordable = False

    def save(self, consulted: set[str]) -> None:
        """Record this run, a no-op that ends with exit status 0, with the files the store's stat
        cache vouched for (`consulted`). Recording never fails the build: a run that cannot be
        recorded (an unreadable input, a full disk, a read-only store) leaves no record, and the
        next run builds in full."""
        if not self.recordable:
            return
        self.recordable = False  # the record's own writing is not an input
        from pathlib import Path

        from trtbuild.store.hash import atomic_write

        try:
            atomic_write(Path(self.path), json.dumps(self._record(consulted), separators=(",", ":")).encode())
        except Exception:
            self.discard()

    def _record(self, consulted: set[str]) -> dict:
        modules = {m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)}
        ours = os.path.dirname(self.path) + os.sep
        files = sorted(p for p in {os.path.abspath(p) for p in (*self.paths, *consulted, *modules)}
                       if not p.startswith(_NOT_FILES) and not p.startswith(ours))
        hardware = sys.modules.get("trtbuild.hardware")
        probed = [name for name, fn in (("gpus", "detect_gpus"), ("driver", "driver_info"))
                  if hardware is not None and getattr(hardware, fn).cache_info().currsize]
        return {"schema": SCHEMA, "identity": self.identity, "files": [[p, _stat(p)] for p in files],
                "probes": _probes(probed) if probed else {}, "stdout": "".join(self.stdout.written),
                "stderr": "".join(self.stderr.written), "exit_code": 0}

    def discard(self) -> None:
        """This run was not a recordable no-op: a record of its command line is out of date (its
        inputs changed, or it would have been replayed), so it goes."""
        self.recordable = False
        try:
            os.unlink(self.path)
        except OSError:
            pass


def arm(argv: list[str]) -> None:
    """Called by the console entry point for `trtbuild build`: this run may be recorded (only
    output to a file or pipe is: a terminal's has bars that come and go)."""
    global _armed
    try:
        path = _record_path(argv)
        if path is not None and _plain_streams():
            _armed = Recorder(argv, path)
    except Exception:  # (a working folder that is gone): not recorded; the command says what is wrong
        _armed = None


def armed() -> Optional[Recorder]:
    return _armed
