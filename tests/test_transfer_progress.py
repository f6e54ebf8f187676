"""The bar of bytes of `trtbuild pull` and `push`: the transfer code tells it the exact bytes it
moves (against SeaweedFS), the commands draw it only on a terminal's stderr and never with --json,
and what they print elsewhere is unchanged."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from test_transfer import PushItem, bucket, make_artifact, project, push, seaweed  # noqa: F401 (fixtures)
from trtbuild.cli import transferbar
from trtbuild.store.hash import CHUNK
from trtbuild.store.local import LocalStore
from trtbuild.store.s3 import S3Store
from trtbuild.store.transfer import pull


class Heard:
    """A ByteProgress that writes down what it hears."""

    def __init__(self) -> None:
        self.expected: list[int] = []
        self.advanced: list[int] = []

    def expect(self, nbytes: int) -> None:
        self.expected.append(nbytes)

    def advance(self, nbytes: int) -> None:
        self.advanced.append(nbytes)


def big_files() -> dict[str, bytes]:  # one file of several read chunks, two small ones, all different
    return {"config.json": b'{"tag": "big"}', "rank0.safetensors": bytes(range(256)) * (CHUNK // 256 * 2 + 7),
            "sub/tokenizer.json": b"tokens " * 100}


def test_push_and_pull_progress_hear_exactly_the_artifacts_bytes(project, bucket, tmp_path):  # noqa: F811
    record = make_artifact(project.local, tmp_path / "art", big_files(), "base-tp1", 1)
    total = sum(len(data) for data in big_files().values())
    assert record.size == total
    remote = S3Store(bucket)
    up = Heard()
    push(project.local, remote, [PushItem(record, ("tiny", "base-tp1"))], progress=up)
    assert (up.expected, sum(up.advanced)) == ([total], total)

    fresh = LocalStore(tmp_path / "fresh")
    down = Heard()
    digest, moved = pull(remote, fresh, record.key, progress=down)
    assert (digest, down.expected, sum(down.advanced), moved.bytes) == (record.digest, [total], total, total)
    assert len(down.advanced) > 3  # chunk by chunk, not a blob at a time

    again = Heard()  # everything is local now: nothing to move, nothing heard but the zero
    _, moved = pull(remote, fresh, record.key, progress=again)
    assert (again.expected, again.advanced, moved.bytes) == ([0], [], 0)
    repush = Heard()  # the remote has the artifact: no blob is even looked at
    push(project.local, remote, [PushItem(record, ("tiny", "base-tp1"))], progress=repush)
    assert (repush.expected, repush.advanced) == ([], [])


def test_pull_and_push_give_the_cli_bar_the_bytes_and_json_turns_it_off(project, run, bucket, tmp_path,  # noqa: F811
                                                                        monkeypatch):
    record = project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.write_lock()
    opened: list[tuple[str, bool, Heard]] = []

    @contextlib.contextmanager
    def fake_bar(label, enabled=True, stream=None):
        heard = Heard()
        opened.append((label, enabled, heard))
        yield heard

    monkeypatch.setattr(transferbar, "bar", fake_bar)
    pushed = run("push", project.recipe, "--store", bucket)
    assert pushed.exit_code == 0
    [(label, enabled, heard)] = opened
    moved = int(pushed.stdout.splitlines()[-1].split()[0])
    assert (label, enabled, len(heard.expected), moved) == ("push", True, 2, 5)
    assert sum(heard.expected) == sum(heard.advanced)

    opened.clear()
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy"))
    dest = tmp_path / "model"
    pulled = run("pull", project.lock_path, "--store", bucket, "--target", "base-tp1", "--dest", dest)
    assert (pulled.exit_code, pulled.stdout, pulled.stderr) == (0, f"{dest}\n", f"new store at {tmp_path / 'deploy'}\n")
    [(label, enabled, heard)] = opened
    assert (label, enabled, heard.expected, sum(heard.advanced)) == ("pull base-tp1", True, [record.size], record.size)

    opened.clear()
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy2"))
    as_json = run("pull", project.lock_path, "--store", bucket, "--target", "base-tp1", "--json")
    assert (as_json.exit_code, as_json.stderr) == (0, f"new store at {tmp_path / 'deploy2'}\n")
    assert json.loads(as_json.stdout)["moved"]["bytes"] == record.size
    assert [(label, enabled) for label, enabled, _ in opened] == [("pull base-tp1", False)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_draws_only_on_a_terminal_and_only_when_enabled():
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        with transferbar.bar("pull x", enabled=enabled, stream=stream) as progress:
            assert progress is None
        assert stream.getvalue() == ""
    screen = Terminal()
    with transferbar.bar("pull x", stream=screen) as progress:
        progress.expect(3 * 1000 * 1000)
        progress.advance(3 * 1000 * 1000)
    assert "pull x" in screen.getvalue() and "3.0/3.0 MB" in screen.getvalue()


def test_cli_pull_without_a_terminal_prints_only_the_path(project, run, bucket, tmp_path, monkeypatch):  # noqa: F811
    project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.write_lock()
    assert run("push", project.recipe, "--store", bucket).exit_code == 0
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "deploy"))
    dest = tmp_path / "model"
    pulled = run("pull", project.lock_path, "--store", bucket, "--target", "base-tp1", "--dest", dest)
    assert (pulled.exit_code, pulled.stdout, pulled.stderr) == (0, f"{dest}\n", f"new store at {tmp_path / 'deploy'}\n")
