"""`trtbuild cache gc --store s3://...` against SeaweedFS: a dry run by default that lists exactly
what would go, `--yes` removes exactly that, refs' artifacts and pushed lock files' pins stay, and
leases keep gc and push apart."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from test_transfer import PushItem, bucket, make_artifact, project, push, seaweed, three_files  # noqa: F401 (fixtures)
from trtbuild.errors import TrtbuildError
from trtbuild.plan.estimate import format_bytes
from trtbuild.store import lease
from trtbuild.store.s3 import S3Store


def objects(store: S3Store) -> set[str]:
    return {store.transport.describe(rel) for rel, _ in store.transport.list("")}


def names(store: S3Store, prefix: str) -> list[str]:
    return [rel for rel, _ in store.transport.list(prefix)]


def blob_bytes(manifests) -> int:
    return sum({e.sha256: e.size for m in manifests for e in m.entries}.values())


def published(project, run, url: str):  # noqa: F811
    """A pushed recipe whose ref then moved on (the old artifact stays pinned by the pushed lock file),
    and an artifact pushed with no ref and in no lock: (store, the lock's digest, the ref's, the orphan record)."""
    project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.write_lock()
    assert run("push", project.recipe, "--store", url).exit_code == 0
    store = S3Store(url)
    newer = make_artifact(project.local, project.tmp / "newer", three_files("newer"), "base-tp1", 50)
    push(project.local, store, [PushItem(newer, ("tiny", "base-tp1"))])
    orphan = make_artifact(project.local, project.tmp / "orphan", three_files("orphan"), "fp8-tp1", 51)
    push(project.local, store, [PushItem(orphan)])
    return store, project.targets["base-tp1"].digest, newer.digest, orphan


def doomed_of(store: S3Store, project, orphan) -> list[str]:  # noqa: F811
    """What gc must remove: the orphan's record, manifest, and the blobs no other artifact shares."""
    kept = {e.sha256 for d in (project.targets["base-tp1"].digest, project.targets["base-tp1:validate"].digest)
            for e in project.local.get_manifest(d).entries}
    kept |= {e.sha256 for r in project.local.records() if r.key != orphan.key
             for e in project.local.get_manifest(r.digest).entries}
    blobs = sorted({e.sha256 for e in project.local.get_manifest(orphan.digest).entries} - kept)
    assert len(blobs) == 2  # config.json and rank0 are the orphan's own; sub/notes.txt is shared
    return [store.describe_record(orphan.key), store.describe_manifest(orphan.digest),
            *(store.describe_blob(b) for b in blobs)]


def test_a_dry_run_by_default_lists_exactly_what_would_go_and_yes_removes_exactly_that(project, run, bucket):  # noqa: F811
    store, pinned, current, orphan = published(project, run, bucket)
    doomed = doomed_of(store, project, orphan)
    freed = sum(e.size for e in project.local.get_manifest(orphan.digest).entries
                if store.describe_blob(e.sha256) in doomed)
    live = [project.local.get_manifest(d) for d in (pinned, current, project.targets["base-tp1:validate"].digest)]
    summary = (f"1 records, 1 manifests, 2 blobs ({format_bytes(freed)}), 0 checkouts; "
               f"store now {format_bytes(blob_bytes(live))}\n")
    before = objects(store)
    assert set(doomed) < before

    dry = run("cache", "gc", "--store", bucket)
    assert (dry.exit_code, dry.stderr) == (0, "")
    assert dry.stdout == ("".join(f"would remove {where}\n" for where in doomed) + "would remove " + summary
                          + f"dry run: nothing was removed; `trtbuild cache gc --store {bucket} --yes` removes it\n")
    assert objects(store) == before

    real = run("cache", "gc", "--store", bucket, "--yes")
    assert (real.exit_code, real.stderr) == (0, "")
    assert real.stdout == "".join(f"removed {where}\n" for where in doomed) + "removed " + summary
    assert before - objects(store) == set(doomed) and objects(store) <= before
    # the ref's artifact and the pushed lock file's pin are whole; the orphan is gone
    assert store.read_ref("tiny", "base-tp1").digest == current
    assert (store.artifact_problem(current), store.artifact_problem(pinned)) == (None, None)
    assert store.get_record(orphan.key) is None
    assert store.transport.get("locks/tiny.lock").data == project.lock_path.read_bytes()
    again = run("cache", "gc", "--store", bucket, "--yes")
    assert again.stdout == f"removed 0 records, 0 manifests, 0 blobs (0 B), 0 checkouts; store now {format_bytes(blob_bytes(live))}\n"


def test_the_json_of_a_remote_dry_run_names_each_object(project, run, bucket):  # noqa: F811
    import json

    store, _, _, orphan = published(project, run, bucket)
    out = run("cache", "gc", "--store", bucket, "--json")
    assert out.exit_code == 0
    data = json.loads(out.stdout)
    assert (data["dry_run"], data["objects"], data["records"]) == (True, doomed_of(store, project, orphan), [orphan.key])
    both = run("cache", "gc", "--store", bucket, "--dry-run", "--yes")
    assert (both.exit_code, both.stderr) == (2, "--dry-run and --yes: pick one\n")


def write_lease(store: S3Store, kind: str, expires: dt.datetime) -> str:
    rel = f"leases/{kind}-ci-7-0000abcd.json"
    store.transport.put(rel, lease.Lease(kind=kind, host="ci", pid=7, started="2026-12-01T00:00:00Z",
                                        expires=expires.strftime("%Y-%m-%dT%H:%M:%SZ")).model_dump_json().encode())
    return rel


def test_gc_refuses_while_a_push_lease_is_unexpired_and_an_expired_one_does_not_block(project, run, bucket):  # noqa: F811
    store, _, _, orphan = published(project, run, bucket)
    until = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(hours=1)
    rel = write_lease(store, "push", until)
    before = objects(store)
    for args in ((), ("--yes",)):
        refused = run("cache", "gc", "--store", bucket, *args)
        assert (refused.exit_code, refused.stdout) == (1, "")
        assert refused.stderr == (f"store {bucket}: a publish is in flight; cache gc removed nothing "
                                  f"(lease {store.transport.describe(rel)}, ci pid 7, until {until:%Y-%m-%dT%H:%M:%SZ})\n")
        assert objects(store) == before  # and gc left no lease of its own
    write_lease(store, "push", until - dt.timedelta(hours=2))  # its holder died an hour ago
    done = run("cache", "gc", "--store", bucket, "--yes")
    assert (done.exit_code, done.stderr) == (0, "")
    assert store.get_record(orphan.key) is None


def test_push_writes_its_lease_and_removes_it_also_when_it_fails(project, bucket, monkeypatch):  # noqa: F811
    store = S3Store(bucket)
    record = make_artifact(project.local, project.tmp / "a", three_files("a"), "base-tp1", 1)
    seen = []
    original = store.put_blobs

    def watched(sources, progress=None):  # the artifact's three blobs go up in one transfer-manager call
        seen.append([(rel, held.kind, held.host, held.pid) for rel, held in lease.active(store, "push")])
        return original(sources, progress)

    monkeypatch.setattr(store, "put_blobs", watched)
    push(project.local, store, [PushItem(record, ("tiny", "base-tp1"))], lock=("tiny", b"lock bytes\n"))
    assert len(seen) == 1
    [(rel, kind, host, pid)] = seen[0]
    assert (rel.startswith("leases/push-"), kind, pid) == (True, "push", os.getpid())
    assert names(store, "leases/") == []
    assert store.transport.get("locks/tiny.lock").data == b"lock bytes\n"

    other = make_artifact(project.local, project.tmp / "b", three_files("b"), "fp8-tp1", 2)

    def broken(manifest):
        assert len(lease.active(store, "push")) == 1
        raise TrtbuildError("the network went away")

    monkeypatch.setattr(store, "put_manifest", broken)
    with pytest.raises(TrtbuildError, match="^the network went away$"):
        push(project.local, store, [PushItem(other, ("tiny", "fp8-tp1"))])
    assert names(store, "leases/") == []


def test_push_refuses_while_gc_holds_a_lease_and_sends_nothing(project, bucket):  # noqa: F811
    store = S3Store(bucket)
    record = make_artifact(project.local, project.tmp / "a", three_files("a"), "base-tp1", 1)
    until = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(hours=1)
    rel = write_lease(store, "gc", until)
    with pytest.raises(TrtbuildError) as caught:
        push(project.local, store, [PushItem(record, ("tiny", "base-tp1"))])
    assert str(caught.value) == (f"store {bucket}: cache gc is removing objects; push again when it ends "
                                 f"(lease {store.transport.describe(rel)}, ci pid 7, until {until:%Y-%m-%dT%H:%M:%SZ})")
    assert names(store, "") == [rel]


def test_every_pushed_lock_keeps_its_pins_after_a_newer_lock_of_the_recipe_is_pushed(project, run, bucket):  # noqa: F811
    """Lock A is pushed; the recipe is rebuilt (its artifact changed) and lock B pushed: gc keeps what
    A pins, and both locks stay in the store (the newest also at locks/<recipe>.lock)."""
    import hashlib

    project.add("base-tp1")
    project.add("base-tp1:validate", "validate", gates_passed=True)
    project.write_lock()
    lock_a = project.lock_path.read_bytes()
    pinned_by_a = project.targets["base-tp1"].digest
    assert run("push", project.recipe, "--store", bucket).exit_code == 0
    rebuilt = make_artifact(project.local, project.tmp / "rebuilt", three_files("rebuilt"), "base-tp1", 60)
    project.targets["base-tp1"] = project.targets["base-tp1"].model_copy(
        update={"key": rebuilt.key, "digest": rebuilt.digest, "size": rebuilt.size})  # another artifact of the target
    project.write_lock()
    lock_b = project.lock_path.read_bytes()
    assert lock_b != lock_a
    assert run("push", project.recipe, "--store", bucket).exit_code == 0
    store = S3Store(bucket)
    assert names(store, "locks/") == sorted([
        "locks/tiny.lock", *(f"locks/tiny/{hashlib.sha256(data).hexdigest()}.lock" for data in (lock_a, lock_b))])
    assert store.transport.get("locks/tiny.lock").data == lock_b
    real = run("cache", "gc", "--store", bucket, "--yes")
    assert (real.exit_code, real.stderr) == (0, "")
    live = [project.local.get_manifest(t.digest) for t in project.targets.values()] + [project.local.get_manifest(pinned_by_a)]
    assert real.stdout == f"removed 0 records, 0 manifests, 0 blobs (0 B), 0 checkouts; store now {format_bytes(blob_bytes(live))}\n"
    assert store.artifact_problem(pinned_by_a) is None
    assert store.read_ref("tiny", "base-tp1").digest == project.targets["base-tp1"].digest


def test_a_malformed_pushed_lock_of_the_history_makes_gc_refuse_and_remove_nothing(project, run, bucket):  # noqa: F811
    store, _, _, _ = published(project, run, bucket)
    rel = "locks/tiny/" + "0" * 64 + ".lock"
    store.transport.put(rel, b"schema: [\n")
    before = objects(store)
    for args in ((), ("--yes",)):
        refused = run("cache", "gc", "--store", bucket, *args)
        assert (refused.exit_code, refused.stdout) == (1, "")
        assert refused.stderr == (f"{store.transport.describe(rel)}: not a trtbuild lock file; cache gc removed nothing "
                                  "(what it pins is unknown): push that recipe again or remove it\n")
        assert objects(store) == before


def test_a_push_lease_is_rewritten_after_an_artifact_only_when_its_last_write_is_a_minute_old(bucket, monkeypatch):  # noqa: F811
    store = S3Store(bucket)
    clock = [dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.timezone.utc)]
    monkeypatch.setattr(lease, "_now", lambda: clock[0])
    writes = []
    original = store.transport.put
    monkeypatch.setattr(store.transport, "put", lambda rel, data: (writes.append(data), original(rel, data))[1])
    held = lease.Held(store, "push", ttl_s=3600)
    clock[0] += dt.timedelta(seconds=lease.RENEW_AFTER_S - 1)
    held.renew()  # too soon: the lease written a moment ago still expires an hour out, less a minute at most
    assert [lease.Lease.model_validate_json(w).expires for w in writes] == ["2026-12-01T13:00:00Z"]
    clock[0] += dt.timedelta(seconds=1)
    held.renew()
    assert [lease.Lease.model_validate_json(w).expires for w in writes] == ["2026-12-01T13:00:00Z",
                                                                             "2026-12-01T13:01:00Z"]
    held.release()
    assert names(store, "leases/") == []
