"""The test suite leaves nothing behind (issue 10: a run left 4 GB in /tmp): a small session of it,
run with a temporary folder of its own, leaves that folder as it found it but for pytest's empty
per-user root, and writes nothing into the clone (no ./cache, .pytest_cache/, .hypothesis/; conftest's
repo_outputs)."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time

from conftest import ROOT, repo_outputs

# Cheap tests that write what the whole suite writes: a store on real files, `trtbuild build` in a
# subprocess, a TensorRT-LLM stage test importing torch and transformers, a recipe refused.
SAMPLE = ["tests/test_store.py", "tests/test_gc.py::test_gc_dry_run_reports_what_gc_then_removes_and_removes_nothing",
          "tests/test_trtllm_stage.py::test_devices_used_follow_cuda_visible_devices_and_the_world_size",
          "tests/test_cli_build.py::test_a_malformed_recipe_stops_build_with_one_line_and_no_store",
          # Hypothesis, which keeps a folder of its own in the working directory unless told otherwise
          "tests/test_fuzz_recipes.py::test_a_document_that_is_not_a_mapping_is_one_line"]


def test_a_passing_session_leaves_nothing_in_the_temporary_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    before = repo_outputs()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a session of its own
    env["TMPDIR"] = str(tmp)
    env.pop("TRTBUILD_CACHE")  # as a developer runs it: the session must not fall back to ./cache
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", *SAMPLE], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    assert sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")) == [f"pytest-of-{getpass.getuser()}"]
    assert repo_outputs() == before


def test_the_s3_test_server_leaves_nothing_in_tmp():
    """weed makes gRPC sockets at fixed /tmp paths, beside its own folder: both go when it stops."""
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        deadline = time.monotonic() + 30  # weed opens them soon after its S3 port, later on a loaded machine
        while not all(socket.exists() for socket in server.fixed_sockets) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(socket.exists() for socket in server.fixed_sockets)  # where weed puts them
        folder, sockets = server.dir, server.fixed_sockets
    assert not folder.exists() and not any(socket.exists() for socket in sockets)
