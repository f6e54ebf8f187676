"""A folder store's own lock (locks/store.lock): builds hold it shared, `cache gc` and repair
exclusively; and the waits on the locks of a store, said in one line naming the holder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.store import layout

if TYPE_CHECKING:
    from filelock import FileLock

    from trtbuild.store.folder import FolderTransport

Say = Callable[[str], None]  # where a store's one-line notices go (a build's progress lines)


def _to_stderr(line: str) -> None:
    """A notice of a command without a progress reporter (push, pull): a line on stderr, looked up
    when written, so that a live progress bar (rich redirects stderr) prints it above itself."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def lock_holder(path: Path) -> Optional[str]:
    """Who holds the flock on `path`, from the kernel's table (/proc/locks, Linux): "pid N (its
    command line)", or None when that cannot be told. Nothing is written to say who holds a lock:
    a stale note could only mislead, the kernel's table cannot."""
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = []  # "1: FLOCK  ADVISORY  WRITE 4711 fe:00:2157153 0 EOF"; "1: -> FLOCK ..." is a waiter
    for fields in (line.split() for line in table.splitlines()):
        # an overlay file system names its upper layer's device: the inode alone, after an exact match
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(st.st_ino):
            pids.insert(0 if fields[5] == device else len(pids), fields[4])
    if not pids:
        return None
    try:
        command = " ".join(Path(f"/proc/{pids[0]}/cmdline").read_bytes().decode(errors="replace").split("\0")).strip()
    except OSError:
        command = ""
    if len(command) > 80:
        command = command[:77] + "..."
    return f"pid {pids[0]} ({command})" if command else f"pid {pids[0]}"


@contextlib.contextmanager
def waiting(lock: "FileLock", what: str, say: Optional[Say]) -> Iterator[None]:
    """Hold `lock`; when another process holds it, say so (naming the holder when the kernel tells)
    before waiting for it."""
    from filelock import Timeout

    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = lock_holder(Path(lock.lock_file))
        (say or _to_stderr)(f"{what}: waiting for {lock.lock_file}" + (f", held by {holder}" if holder else ""))
        lock.acquire()
    try:
        yield
    finally:
        lock.release()




class StoreLock:
    """The store lock of the folder store `folder`, and the creation and removal of a store around it."""

    def __init__(self, folder: "FolderTransport") -> None:
        self.folder = folder
        self.root = folder.root

    def _require(self) -> None:
        if not self.folder.exists():
            raise InvalidInput(self.folder.missing())

    @contextlib.contextmanager
    def using(self, exclusive: bool = False, wait: bool = True, say: Optional[Say] = None) -> Iterator[None]:
        """Builds hold the store shared, and create it: a build creates its store when it first
        writes, not before its recipe was checked. `cache gc` holds it exclusive, so it never
        deletes bytes a running build has written but not yet recorded; exclusive use needs a store
        that exists (gc and repair never create one). A store this call created is removed again
        when the work ends in an error (a source refused at build time, a hub that cannot be
        reached, Ctrl-C) before storing anything: then nothing was written.

        `say` (else stderr) gets the store's one-line notices: a wait for the store held exclusive,
        and "new store at PATH" when this call made the store's folder (a mistyped --store starts
        an empty store), said when it first stores something (_storing), so a run that ends
        without storing anything (and leaves no store) does not say it."""
        made = None
        new_folder = not exclusive and not self.root.exists()
        if exclusive:
            self._require()
        elif not self.folder.exists():
            made = self._missing_layout()
        handle = self._lock_store(exclusive, wait, say or _to_stderr)
        if new_folder:
            self.folder.announce = lambda: (say or _to_stderr)(f"new store at {self.root}")
        try:
            yield
        except BaseException:
            if made is not None:
                self._discard_if_empty(handle, made)
            raise
        finally:
            self.folder.announce = None
            handle.close()  # closing the last descriptor releases the flock

    def _lock_store(self, exclusive: bool, wait: bool, say: Say):
        """locks/store.lock, flocked. A store removed (by _discard_if_empty) between opening the
        file and locking it leaves a lock on a file no one else will open: then again, on the new one.
        A wait (a build while `cache gc` runs) is said first, once."""
        said = False
        while True:
            if not exclusive:
                self.folder.writing()
            path = self.root / layout.STORE_LOCK
            try:
                handle = open(path, "a+")
            except FileNotFoundError:  # removed just after it was made: make it again
                if exclusive:
                    self._require()
                continue
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    handle.close()
                    raise TrtbuildError(f"store {self.root} is in use by a running build; try again when it ends") from None
                if not said:
                    holder = lock_holder(path)
                    say(f"store {self.root}: waiting for {path}" + (f", held by {holder}" if holder else ""))
                    said = True
                fcntl.flock(handle, mode)
            try:
                if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                    return handle
            except FileNotFoundError:
                pass
            handle.close()
            if exclusive:
                self._require()

    def _missing_layout(self) -> list[Path]:
        """What creating the store makes: the topmost missing folder of the root, or, in a folder
        that is there but not a store, the layout entries it lacks."""
        if not self.root.exists():
            top = self.root
            while not top.parent.exists():
                top = top.parent
            return [top]
        tops = {sub.split("/")[0] for sub in layout.FOLDER_LAYOUT}
        return [self.root / name for name in (*tops, *layout.STATE_FILES) if not (self.root / name).exists()]

    def _holds_nothing(self, made: list[Path]) -> bool:
        """Nothing under `made` but what opening and locking a store writes: folders, lock files,
        the stat cache, and the recipe claims under refs/ (no blob, manifest, record, ref,
        checkout, log or report)."""
        for path in (p for top in made for p in (top, *(top.rglob("*") if top.is_dir() else ()))):
            if path.is_dir() and not path.is_symlink():
                continue  # a folder holds nothing by itself
            if self.root not in path.parents:
                return False  # a file beside the store, in a folder made for it: someone else's
            if not layout.is_workspace_leftover(path.relative_to(self.root).parts):
                return False
        return True

    def _discard_if_empty(self, handle, made: list[Path]) -> None:
        """Remove what this process created of the store, when no other process uses the store
        (the shared lock becomes exclusive, or nothing is removed) and it holds nothing stored."""
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        try:
            if not self._holds_nothing(made):
                return
            self.folder.close_state()
            for path in made:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        except OSError:
            pass  # an empty store left behind is harmless; the error that brought us here is what counts

