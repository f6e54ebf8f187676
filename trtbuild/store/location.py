"""Which store a command means: --store URL, else $TRTBUILD_CACHE, else ./cache (one place holds
the rule; it needs none of local.py's imports)."""

from __future__ import annotations

import os
from typing import Optional

DEFAULT_ROOT = "cache"


def store_url(url: Optional[str] = None) -> str:
    """The store URL a command uses: a folder path or `s3://bucket/prefix` (file:// dropped)."""
    url = url or os.environ.get("TRTBUILD_CACHE") or DEFAULT_ROOT
    return url[len("file://"):] if url.startswith("file://") else url
