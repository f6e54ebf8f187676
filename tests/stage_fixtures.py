"""Fixtures of the tests that run stagekit's stages through the runner (test_runner.py,
test_worker_pool.py): import them by name to use them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trtbuild.store.local import LocalStore

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def stage_modules_importable(monkeypatch):
    """Stage workers are fresh interpreters: they must find tests/stagekit.py."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")
