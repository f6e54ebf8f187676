"""File-system faults that are the host's, not a bug: a full disk, a read-only or forbidden folder.
Each reaches the user as one line naming the path (`PATH: no space left on device`), never a
traceback: exit 1 for a full disk, 2 for a path that cannot be written (the user picked it)."""

from __future__ import annotations

import errno
import os
import sqlite3
from typing import Optional

from trtbuild.errors import InvalidInput, TrtbuildError

FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
DENIED = {errno.EROFS, errno.EACCES, errno.EPERM}
# sqlite reports the same faults in its own codes (index.db, the stat cache)
_SQLITE = {sqlite3.SQLITE_FULL: errno.ENOSPC, sqlite3.SQLITE_READONLY: errno.EROFS, sqlite3.SQLITE_PERM: errno.EACCES}


def is_fault(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL | DENIED


def at(exc: OSError, path: "str | os.PathLike") -> OSError:
    """The same fault, naming `path` (the file the user knows, not a temporary one beside it)."""
    return OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def from_sqlite(exc: sqlite3.Error, path: "str | os.PathLike") -> Optional[OSError]:
    """A full or read-only database as the OSError it is, naming the database; None for others."""
    code = _SQLITE.get((getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF)  # its extended codes too
    return OSError(code, os.strerror(code), str(path)) if code else None


def user_error(exc: OSError) -> Optional[TrtbuildError]:
    """The one line for a fault (None for any other OSError, which stays a bug's traceback)."""
    if not is_fault(exc):
        return None
    reason = os.strerror(exc.errno).lower()
    line = f"{exc.filename}: {reason}" if exc.filename else reason
    return (InvalidInput if exc.errno in DENIED else TrtbuildError)(line)
