"""`trtbuild push` and `trtbuild pull` on the embedded demo recipe (issue #23 items 1 and 6): the demo
and a path that resolves to its file are one recipe; push takes a recipe (the demo by default), never
a lock; pull on a deploy host reads the lock push published. Hand-written locks and tiny artifacts
(tests/test_transfer.py's), so no model is built here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from test_transfer import make_artifact, three_files
from trtbuild.lock import lockfile
from trtbuild.recipe.schema import default_recipe
from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile
from trtbuild.recipe.schema import load_recipe, recipe_identity
from trtbuild.store.local import LocalStore

DEMO = "smollm2-135m-demo"  # the embedded recipe's `name:`
EMBEDDED = "embedded:smollm2-demo.yaml"


class Demo:
    """The embedded demo's lock in the local store ($TRTBUILD_CACHE), naming tiny artifacts there."""

    def __init__(self, tmp_path: Path, monkeypatch) -> None:
        self.tmp = tmp_path
        self.local = LocalStore(tmp_path / "local")
        self.local.create()
        monkeypatch.setenv("TRTBUILD_CACHE", str(self.local.root))
        self.lock_path = self.local.workspace().embedded_lock_path(DEMO)
        self.remote = tmp_path / "remote"
        self.targets: dict[str, LockedTarget] = {}
        self.digest = lockfile.recipe_digest(load_recipe(default_recipe()))

    def add(self, target: str, stage: str = "checkpoint", gates_passed=None) -> None:
        n = len(self.targets) + 1
        record = make_artifact(self.local, self.tmp / "art" / target.replace(":", "_"), three_files(target), target,
                               n, stage)
        self.targets[target] = LockedTarget(stage=stage, key=record.key, digest=record.digest, size=record.size,
                                            gates_passed=gates_passed)

    def validated(self) -> "Demo":
        self.add("base-tp1")
        self.add("base-tp1:validate", "validate", gates_passed=True)
        self.write_lock()
        return self

    def write_lock(self, digest: str | None = None) -> None:
        lock = LockFile(recipe=LockedRecipe(name=DEMO, digest=digest or self.digest), source=None, toolchain={},
                        targets=self.targets, validation="run")
        self.lock_path.write_text(lockfile.HEADER + yaml.safe_dump(lock.model_dump(mode="json", by_alias=True)))


@pytest.fixture
def demo(tmp_path, monkeypatch):
    return Demo(tmp_path, monkeypatch)


def link_to_the_demo(folder: Path, name: str = "smollm2-demo.yaml") -> Path:
    """What the repository's recipes/smollm2-demo.yaml is: a symbolic link to the package's recipe."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / name
    link.symlink_to(default_recipe())
    return link


# ---- one recipe -------------------------------------------------------------------------------------

def test_a_path_that_resolves_to_the_packages_recipe_is_the_embedded_recipe(tmp_path):
    link = link_to_the_demo(tmp_path / "recipes", "another-name.yaml")
    loaded = load_recipe(link)
    assert loaded.embedded and load_recipe(default_recipe()).embedded
    assert recipe_identity(loaded) == recipe_identity(load_recipe(default_recipe())) == EMBEDDED
    copy = tmp_path / "copy.yaml"  # the same text in another file is another recipe
    copy.write_bytes(default_recipe().read_bytes())
    assert not load_recipe(copy).embedded
    assert recipe_identity(load_recipe(copy)) == str(copy.resolve())


# ---- push -------------------------------------------------------------------------------------------

def test_push_help_names_an_optional_recipe_and_no_lock_file_argument(run):
    result = run("push", "--help")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0].endswith(" push [OPTIONS] [RECIPE]")
    assert "for a lock file" not in result.stdout  # the --store help of pull, which does take one


def test_push_without_a_recipe_publishes_the_demo_from_its_lock_in_the_local_store(demo, run):
    demo.validated()
    result = run("push", "--store", demo.remote)
    assert (result.exit_code, result.stderr) == (0, f"new store at {demo.remote}\n")  # a folder that was not there
    assert result.stdout.splitlines()[0] == "pushed base-tp1"
    remote = LocalStore(demo.remote)
    assert remote.read_ref(DEMO, "base-tp1").digest == demo.targets["base-tp1"].digest
    assert not (demo.tmp / "local" / "smollm2-demo.lock").exists()


def test_push_of_the_demo_through_a_link_to_its_file_is_the_same_recipe_in_the_same_store(demo, run):
    demo.validated()
    assert run("push", "--store", demo.remote).exit_code == 0
    link = link_to_the_demo(demo.tmp / "checkout" / "recipes")
    again = run("push", link, "--store", demo.remote)  # claimed by the embedded recipe: the same one
    assert (again.exit_code, again.stderr) == (0, "")
    assert again.stdout.startswith("pushed base-tp1\n0 blobs (0 B) sent, ")
    assert not link.with_suffix(".lock").exists()


def test_a_push_refused_by_another_recipes_claim_sends_nothing(demo, run):
    """The name is checked before anything is sent (store.check_claim) and claimed only once the
    artifacts are there (transfer.push): a refused push leaves the store as it found it."""
    demo.validated()
    remote = LocalStore(demo.remote)
    remote.create()
    remote.claim_recipe(DEMO, "recipes/another.yaml")
    before = sorted(p.relative_to(demo.remote).as_posix() for p in demo.remote.rglob("*"))
    result = run("push", "--store", demo.remote)
    claim = demo.remote / "refs" / DEMO / ".recipe.json"
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"recipe {EMBEDDED}: name {DEMO!r} already belongs to recipes/another.yaml in store {demo.remote}; "
               f"give this recipe another `name:` (or remove {claim} to hand the name over)\n")
    assert sorted(p.relative_to(demo.remote).as_posix() for p in demo.remote.rglob("*")) == before


def test_push_of_the_demo_through_a_link_before_the_embedded_name_is_claimed(demo, run):
    demo.validated()
    link = link_to_the_demo(demo.tmp / "checkout" / "recipes")
    first = run("push", link, "--store", demo.remote)  # the lock is the one in the store, not beside the link
    assert (first.exit_code, first.stderr) == (0, f"new store at {demo.remote}\n")
    assert run("push", "--store", demo.remote).exit_code == 0


def test_push_of_a_lock_file_is_one_line_naming_the_recipe_it_belongs_to(ws, run, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTBUILD_CACHE", str(tmp_path / "local"))
    recipe = ws.recipe("schema: 1\nname: tiny\n", name="tiny.yaml")
    lock = recipe.with_suffix(".lock")
    lock.write_text("recipe: {name: tiny}\n")
    result = run("push", lock, "--store", tmp_path / "remote")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{lock}: a lock file; push takes the recipe it belongs to: "
                             f"`trtbuild push {recipe}`\n")
    assert not (tmp_path / "remote").exists() and not (tmp_path / "local").exists()


def test_push_of_the_demos_lock_file_names_the_bare_command(demo, run):
    demo.validated()
    result = run("push", demo.lock_path, "--store", demo.remote)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{demo.lock_path}: a lock file; push takes the recipe it belongs to: "
                             "`trtbuild push` (the embedded demo)\n")


def test_push_of_the_demo_before_it_was_built_names_the_bare_build(demo, run):
    result = run("push", "--store", demo.remote)
    assert (result.exit_code, result.stderr) == (2, f"{demo.lock_path}: no lock file; run `trtbuild build` first\n")


# ---- pull -------------------------------------------------------------------------------------------

def test_pull_without_an_argument_chooses_from_the_demos_lock(demo, run):
    demo.validated()
    assert run("push", "--store", demo.remote).exit_code == 0
    result = run("pull", "--store", demo.remote, "--target", "base-tp1", "--dry-run")
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == f"would pull base-tp1: artifact {demo.targets['base-tp1'].digest}\n"


@pytest.fixture(scope="module")
def seaweed():
    from s3server import SeaweedS3

    with SeaweedS3() as server:
        yield server


@pytest.fixture
def bucket(seaweed, monkeypatch, request):
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    seaweed.client().create_bucket(Bucket=name)
    yield f"s3://{name}/trtbuild"
    client = seaweed.client()
    for obj in client.list_objects_v2(Bucket=name).get("Contents", []):
        client.delete_object(Bucket=name, Key=obj["Key"])
    client.delete_bucket(Bucket=name)


def deploy_host(demo: Demo, monkeypatch) -> LocalStore:
    """A fresh local store, as on a host that never built the recipe."""
    monkeypatch.setenv("TRTBUILD_CACHE", str(demo.tmp / "deploy-cache"))
    return LocalStore(demo.tmp / "deploy-cache")


def test_pull_on_a_deploy_host_reads_the_lock_push_published(demo, run, bucket, monkeypatch):
    demo.validated()
    assert run("push", "--store", bucket).exit_code == 0
    deploy = deploy_host(demo, monkeypatch)
    dest = demo.tmp / "served"
    result = run("pull", "--store", bucket, "--target", "base-tp1", "--dest", dest)
    assert (result.exit_code, result.stdout) == (0, f"{dest}\n")
    assert result.stderr == f"new store at {deploy.root}\n"  # the fresh local store, said once (item 6)
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == \
        three_files("base-tp1")
    assert deploy.get_record(demo.targets["base-tp1"].key).digest == demo.targets["base-tp1"].digest
    assert not deploy.workspace().embedded_lock_path(DEMO).exists()  # read from the store on every pull, never kept
    link = link_to_the_demo(demo.tmp / "checkout" / "recipes")  # the demo through a link: the same lock
    chosen = run("pull", link, "--store", bucket, "--target", "base-tp1", "--dry-run")
    assert (chosen.exit_code, chosen.stdout) == (0, f"would pull base-tp1: artifact {demo.targets['base-tp1'].digest}\n")


def test_pull_refuses_a_published_lock_of_another_version_of_the_recipe_naming_both_digests(demo, run, bucket,
                                                                                          monkeypatch):
    demo.validated()
    assert run("push", "--store", bucket).exit_code == 0
    deploy_host(demo, monkeypatch)
    assert run("pull", "--store", bucket, "--target", "base-tp1", "--dry-run").exit_code == 0
    other = "0" * 64  # the store's newest lock, pushed from another version of the recipe
    demo.write_lock(digest=other)
    from trtbuild.store.s3 import S3Store
    from trtbuild.store.layout import pushed_lock

    S3Store(bucket).transport.put(pushed_lock(DEMO), demo.lock_path.read_bytes())
    result = run("pull", "--store", bucket, "--target", "base-tp1", "--dry-run")  # read anew: never stale
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{bucket}/locks/{DEMO}.lock: the lock push published is of recipe {other}; this "
                             f"recipe ({EMBEDDED}) is {demo.digest}: push it again from a build of this recipe\n")


def test_pull_on_a_deploy_host_of_a_store_without_the_recipes_lock_is_one_line(demo, run, bucket, monkeypatch):
    from trtbuild.store.s3 import S3Store
    from trtbuild.store.layout import pushed_lock

    demo.validated()
    assert run("push", "--store", bucket).exit_code == 0
    S3Store(bucket).transport.delete(pushed_lock(DEMO))  # its artifacts are there; the lock is not
    deploy = deploy_host(demo, monkeypatch)
    result = run("pull", "--store", bucket, "--target", "base-tp1", "--dry-run")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{deploy.workspace().embedded_lock_path(DEMO)}: no lock file, and {bucket} has none published "
                             f"({bucket}/locks/{DEMO}.lock): run `trtbuild build` and `trtbuild push` first\n")


def test_push_and_pull_of_the_demo_without_a_store_are_one_line_asking_for_store(demo, run):
    """The demo names no publish.store, and its file is the package's: only --store can name one."""
    for command in (["push"], ["pull", "--dry-run"]):
        result = run(*command)
        verb = "push to" if command[0] == "push" else "pull from"
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", f"the embedded demo recipe: no store to {verb}: pass --store URL\n")


def test_pull_of_the_demo_from_a_folder_store_reads_the_lock_push_published_there(demo, run, monkeypatch):
    """A folder store gets the published lock too (published/<recipe>.lock), registered as a gc
    root of that store: a deploy host with only the recipe pulls from a folder as from S3."""
    demo.validated()
    assert run("push", "--store", demo.remote).exit_code == 0
    published = demo.remote / "published" / f"{DEMO}.lock"
    assert published.read_bytes() == demo.lock_path.read_bytes()
    deploy = deploy_host(demo, monkeypatch)
    dest = demo.tmp / "served"
    result = run("pull", "--store", demo.remote, "--target", "base-tp1", "--dest", dest)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"{dest}\n", f"new store at {deploy.root}\n")
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == \
        three_files("base-tp1")
    assert not deploy.workspace().embedded_lock_path(DEMO).exists()  # read from the store on every pull, never kept
    # the shared folder's gc keeps what the published lock names: it is that store's gc root
    assert LocalStore(demo.remote).workspace().registered_lockfiles() == [published]


def test_pull_of_the_demo_from_a_folder_store_nothing_was_pushed_to_is_one_line(demo, run, monkeypatch):
    demo.validated()
    LocalStore(demo.remote).create()
    deploy = deploy_host(demo, monkeypatch)
    result = run("pull", "--store", demo.remote, "--target", "base-tp1", "--dry-run")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (f"{deploy.workspace().embedded_lock_path(DEMO)}: no lock file, and {demo.remote} has none published "
                             f"({demo.remote / 'published' / (DEMO + '.lock')}): run `trtbuild build` and "
                             "`trtbuild push` first\n")