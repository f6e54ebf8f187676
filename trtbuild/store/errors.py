"""The store's own errors, below every module of the store (its transports raise them too)."""

from __future__ import annotations

from trtbuild.errors import TrtbuildError


class CorruptStore(TrtbuildError):
    """Bytes in the store do not match their digest."""


class NoWorkspace(TrtbuildError):
    """A local work area (tmp, checkouts, failures, locks) asked of a store that has none (S3)."""
