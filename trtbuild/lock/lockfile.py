"""`<recipe>.lock`: the resolved source, the toolchain per stage, and each target's key and artifact.

YAML with sorted keys so it diffs well; written atomically by `trtbuild build`; `--locked` refuses
to run when the recipe or the source no longer match it. Never holds secrets: only names,
digests, versions and paths the recipe already shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterable, Mapping, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from trtbuild.errors import InvalidInput
from trtbuild.validate import gates
from trtbuild.keys import canonical_json
from trtbuild.facts.nodeids import is_target
from trtbuild.store.platform import EnginePlatform
from trtbuild.store.hash import atomic_write, bytes_sha256

if TYPE_CHECKING:  # the recipe's models are not needed to read or choose from a lock
    from trtbuild.recipe.schema import LoadedRecipe
    from trtbuild.store.base import Store

LOCK_SCHEMA = 4  # 2: typed, every artifact with its size, toolchain per stage id; 3: a validation's runner and device;
# 4: each entry's inputs (what it was made from), so that no entry outlives the artifacts it describes
HEADER = "# Written by `trtbuild build`: commit it; `trtbuild build --locked` checks against it. Do not edit.\n"
LOCKED_ADVICE = "rebuild without --locked and commit the new lock"


class LockMismatch(InvalidInput):
    """`--locked`: the build would change the lock (which is left as it was)."""


class LockedRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="The recipe's `name:`.")
    digest: str = Field(description="sha256 of the validated recipe (comments and formatting do not count).")
    publish_store: Optional[str] = Field(None, description="The recipe's `publish.store` as written (a folder is "
                                         "relative to the lock file): the default store of `trtbuild pull LOCK`. "
                                         "No action key holds it; absent when the recipe sets none.")


# What an engine target is tied to, so that `trtbuild check --lock` can name the target that fits a
# deploy host without opening the store: the engine's trtbuild.json facts (the one platform model).
LockedPlatform = EnginePlatform


Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class LockedTarget(BaseModel):
    """One graph node as the build left it: the key it was built under and the artifact."""

    model_config = ConfigDict(extra="forbid")
    stage: str = Field(description="The node's stage (source, checkpoint, validate, ...).")
    key: str = Field(pattern=r"^[0-9a-f]{64}$", description="Its action key.")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="Its artifact's digest (sha256 of the manifest).")
    size: int = Field(ge=0, description="The artifact's size in bytes (the sum of its files).")
    metrics: Optional[dict[str, Any]] = Field(None, description="A validation's headline numbers (6 significant digits).")
    gates_passed: Optional[bool] = Field(None, description="A validation: whether every gate passed.")
    runner: Optional[str] = Field(None, description="A validation: the runner its metrics came from (`torch`, "
                                  "`tensorrt_llm VERSION`, `vllm VERSION`).")
    device: Optional[str] = Field(None, description="A validation: the device that runner computed on, as it said.")
    inputs: Optional[dict[str, Sha256]] = Field(
        None, description="Node id -> the artifact digest of each input it was made from (a validation: the artifact "
        "it validated, the reference, the calibration set); absent for the source. An entry a build did not refresh "
        "is kept only while every one of these is still the artifact the lock names for that node.")
    platform: Optional[LockedPlatform] = Field(None, description="An engine: what it is tied to (SM, parallelism, versions).")
    serves: Optional[dict[str, list[str]]] = Field(
        None, description="An hf-checkpoint: runtime (trtllm, vllm, sglang) -> the SMs it serves it on, by the loader "
        "check the build ran (serving/check.json); a runtime whose loader rejects it is absent.")
    held_back: Optional[str] = Field(
        None, description="A target the build held back from publishing (no ref, never pushed or pulled): why, "
        "by the rule of trtbuild/lock/publication.py; absent when it may be published.")


class LockFile(BaseModel):
    """`<recipe>.lock`, after dvc's lock: what was resolved and built, so that a deploy host or a
    `--locked` build needs nothing else."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: int = Field(LOCK_SCHEMA, alias="schema", description="Version of this file's layout.")
    recipe: LockedRecipe = Field(description="Which recipe, and which version of it, this lock is of.")
    source: Optional[dict[str, Any]] = Field(description="The resolved source: kind, location, digest and what its "
                                                         "kind pins (commit and per-file sha256 for the hub).")
    toolchain: dict[str, dict[str, Optional[str]]] = Field(
        description="Stage id (`checkpoint:export`) -> the package versions its keys hold.")
    targets: dict[str, LockedTarget] = Field(description="Node id -> its key and artifact.")
    validation: str = Field(description="`run`, or `skipped (--no-validate)`.")

    def digests(self) -> set[str]:
        return {t.digest for t in self.targets.values()}




def targets_of(lock: LockFile) -> list[tuple[str, LockedTarget]]:
    """The lock's targets (checkpoints, hf-checkpoints, engines), without internal nodes."""
    return [(tid, t) for tid, t in lock.targets.items() if is_target(tid, t.stage)]


def recipe_digest(loaded: LoadedRecipe) -> str:
    """sha256 of the validated recipe (comments and formatting do not count)."""
    return bytes_sha256(canonical_json(loaded.recipe.model_dump(mode="json", by_alias=True)))


def lock_path_for(loaded: LoadedRecipe, store: "Store") -> Path:
    """Beside the recipe (`recipes/x.yaml` -> `recipes/x.lock`); the embedded default recipe has no
    folder of its own (a link to its file is still it), so its lock lives in the store."""
    if loaded.embedded:
        return store.workspace("the embedded recipe's lock file").embedded_lock_path(loaded.recipe.name)
    return loaded.path.with_suffix(".lock")


# safe_load's semantics, parsed by libyaml where PyYAML has it: the pure-Python loader took 0.47 s
# for a lock of 200 targets on a busy 2-core host (libyaml: 0.03 s); `pull --target auto` reads it whole.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


MAX_NESTING = 64  # a lock trtbuild writes nests 5 levels; libyaml's composer recurses in C and
# overflows the C stack (a crash, not an exception) somewhere past 10,000


def _too_deep(text: str) -> bool:
    """Whether the document nests deeper than MAX_NESTING, from libyaml's event stream (its parser
    does not recurse); it stops at the first level too deep, before libyaml reads on."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_SAFE_LOADER):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_NESTING:
                    return True
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError as exc:
        # PyYAML 6.0.4 and later stop at a nesting limit of their own (1,000 flow levels), which
        # their scanner can reach ahead of the events: the same answer as ours, in our words
        if "maximum nesting depth" in str(exc):
            return True
        raise
    return False


def read(path: Path, older_ok: bool = False) -> Optional[LockFile]:
    """The lock at `path`, or None when there is none (or, with `older_ok`, one of an older schema,
    which a build simply rewrites). Anything else that is not a lock trtbuild wrote: one line."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse(raw, path, older_ok)


def parse(raw: bytes, path: "Path | str", older_ok: bool = False) -> Optional[LockFile]:
    """A lock file's bytes, as read() reads them; `path` names where they came from (a file, or a
    store's object URL) in the one line that refuses them."""
    try:
        text = raw.decode()
        if _too_deep(text):
            raise InvalidInput(f"{path}: not a trtbuild lock file (nested deeper than {MAX_NESTING} levels)")
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: not a trtbuild lock file ({' '.join(str(exc).split())})") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path}: not a trtbuild lock file (not UTF-8: {exc.reason} at byte {exc.start})") from None
    except ValueError as exc:  # a value no constructor can make: an integer of 5000 digits, a date with month 13
        raise InvalidInput(f"{path}: not a trtbuild lock file ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: not a trtbuild lock file (not a mapping)")
    if isinstance(data.get("schema"), int) and data["schema"] < LOCK_SCHEMA and older_ok:
        return None
    if data.get("schema") != LOCK_SCHEMA:
        raise InvalidInput(f"{path}: not a trtbuild lock file of schema {LOCK_SCHEMA} (schema: {data.get('schema')!r}); "
                           "rebuild without --locked to rewrite it")
    try:
        lock = LockFile.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) if str(p).isprintable() else repr(p) for p in error["loc"])  # one line, always
        raise InvalidInput(f"{path}: {where}: {error['msg']} (edited by hand? rebuild without --locked to rewrite it)") from None
    wrong = inconsistency(lock.targets)
    if wrong:  # an entry about another artifact than the one the lock names: never served
        raise InvalidInput(f"{path}: targets.{wrong} (edited by hand? rebuild without --locked to rewrite it)")
    return lock


def digests(path: Path) -> set[str]:
    """Every artifact digest a lock file names (what `cache gc` must keep)."""
    lock = read(path, older_ok=True)
    return lock.digests() if lock else set()


def check_locked(path: Path, loaded: LoadedRecipe) -> LockFile:
    """For `--locked`: the lock must exist and record the recipe's digest; returns it. Which side
    differs is not known (the recipe, or the lock edited): the line names both digests."""
    lock = read(path)
    if lock is None:
        raise InvalidInput(f"--locked: {path}: no lock file; run `trtbuild build` without --locked to write it")
    digest = recipe_digest(loaded)
    if lock.recipe.digest != digest:
        raise LockMismatch(f"--locked: {path} records recipe digest {lock.recipe.digest}; the recipe {loaded.path} "
                           f"is {digest}; {LOCKED_ADVICE}")
    return lock


def write(path: Path, loaded: LoadedRecipe, source: Optional[dict], results: list, toolchains: dict[str, dict],
          validated: bool = True, partial_of: Optional[Path] = None,
          made_from: Optional[Mapping[str, Iterable[str]]] = None, known: Optional[set[str]] = None,
          pinned: Optional["Pinned"] = None) -> LockFile:
    """Write the lock, keeping entries of targets this run did not touch when the recipe is unchanged
    and what they were made from is still what the lock names (`carried`). `made_from`: node id ->
    the ids of the nodes it was made from (the graph's inputs), recorded as each entry's `inputs`.
    With `partial_of` (`build --lock-out`: a CI job's slice): only this run's targets and toolchains,
    the source from the lock at `partial_of` when this run resolved none (what `lock merge` takes).
    `known`: every node id of the recipe's graph; a previous entry of another id (a hand edit, a
    trtbuild whose graph changed) is not carried. `pinned` (`--locked`): the lock must come out as
    it was (Pinned.unchanged), else LockMismatch and nothing is written."""
    digest = recipe_digest(loaded)
    base = partial_of or path
    previous = read(base, older_ok=True) if base.exists() else None
    made_from = made_from or {}
    fresh: dict[str, LockedTarget] = {}
    by_id = {r.id: r.digest for r in results if r.digest}
    for r in results:
        if r.digest:
            entry = LockedTarget(stage=r.stage, key=r.key, digest=r.digest, size=r.size)
            deps = list(made_from.get(r.id, ()))
            if deps:  # every input of a done node is done: its digest is this run's
                entry.inputs = {dep: by_id[dep] for dep in deps}
            summary = r.summary  # the record's typed summary (store.summaries), None when the stage wrote none
            kind = summary.kind if summary is not None else None
            if kind == "validate":  # the headline numbers and whether the gates passed
                entry.metrics = {k: float(f"{v:.6g}") if isinstance(v, float) else v
                                 for k, v in summary.metrics.model_dump().items()}
                entry.gates_passed = not gates.failed_gates(summary)
                entry.runner, entry.device = summary.runner, summary.device
            platform = getattr(r, "platform", None)  # engine results carry their trtbuild.json facts
            if platform is not None:
                entry.platform = platform
            if kind == "hf-checkpoint":
                entry.serves = summary.serving.serves
            if is_target(r.id, r.stage):  # the build's publication verdict (publication.py)
                entry.held_back = getattr(r, "ref", None)
            fresh[r.id] = entry
    targets: dict[str, LockedTarget] = {}
    if previous and previous.recipe.digest == digest:
        source = source or previous.source
        if partial_of is None:
            _keep_verdicts(previous, fresh)
            kept = {tid: e for tid, e in previous.targets.items() if known is None or tid in known or tid in fresh}
            targets.update(carried(kept, fresh))
            toolchains = {**previous.toolchain, **toolchains}
    targets.update(fresh)
    recipe = LockedRecipe(name=loaded.recipe.name, digest=digest, publish_store=loaded.recipe.publish.store)
    lock = LockFile(recipe=recipe, source=source, toolchain=toolchains,
                    targets=targets, validation=_validation(validated))
    if pinned is not None:
        pinned.unchanged(lock)
    data = render(lock)
    # the same lock again (a no-op build): no rewrite, no fsync; nor for the same content under
    # another header (the lock `lock merge` wrote, as CI commits it)
    if _read_bytes(path) != data and not (partial_of is None and previous == lock):
        atomic_write(path, data)
    return lock


def _keep_verdicts(previous: LockFile, fresh: dict[str, LockedTarget]) -> None:
    """A target this run found as the same artifact without running any of its validations (`--until
    checkpoint`, `--target` of another node) keeps the publication verdict the lock records: the
    validations it was judged by are carried with it (`carried`), so the verdict is still theirs.
    Recording "X was skipped" instead would rewrite the lock (and refuse `--locked`) for a build
    that changed nothing."""
    from trtbuild.lock.publication import validation_ids

    for tid, entry in fresh.items():
        before = previous.targets.get(tid)
        sm = entry.platform.sm if entry.platform is not None else None
        if (is_target(tid, entry.stage) and before is not None and before.digest == entry.digest
                and not any(v in fresh for v in validation_ids(tid, entry.stage, sm))):
            entry.held_back = before.held_back


def _validation(validated: bool) -> str:
    return "run" if validated else "skipped (--no-validate)"


def carried(previous: dict[str, LockedTarget], fresh: dict[str, LockedTarget]) -> dict[str, LockedTarget]:
    """The previous lock's entries this run did not refresh that still describe what the new lock
    names: an entry goes when an input it was made from is now another artifact, or is no longer in
    the lock (and so is what was made from it, in turn). E.g. vLLM's validation of the previous
    checkpoint goes when a host without vLLM rebuilds the checkpoint from a changed source; it stays
    when that host rebuilt nothing it was made from."""
    kept = {tid: entry for tid, entry in previous.items() if tid not in fresh}
    while True:
        lock = {**kept, **fresh}
        gone = [tid for tid, entry in kept.items()
                if any(dep not in lock or lock[dep].digest != d for dep, d in (entry.inputs or {}).items())]
        if not gone:
            return kept
        for tid in gone:
            del kept[tid]


def inconsistency(targets: dict[str, LockedTarget]) -> Optional[str]:
    """The first entry whose recorded input is another artifact than the one these targets name for
    that node, as 'T: made from N D1, but N is D2'; None when there is none."""
    for tid, entry in sorted(targets.items()):
        for dep, d in sorted((entry.inputs or {}).items()):
            if dep in targets and targets[dep].digest != d:
                return f"{tid}: made from {dep} {d}, but {dep} is {targets[dep].digest}"
    return None


def _read_bytes(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:
        return None


def render(lock: LockFile, header: str = HEADER) -> bytes:
    """The lock's bytes: YAML with sorted keys, unset optional fields left out (the same content is
    always the same bytes, which `lock merge` relies on)."""
    data = lock.model_dump(mode="json", by_alias=True)
    if data["recipe"]["publish_store"] is None:  # a recipe without publish.store: its lock as before
        del data["recipe"]["publish_store"]
    for entry in data["targets"].values():  # only validations carry numbers, engines a platform, hf-checkpoints serves
        for name in ("metrics", "gates_passed", "runner", "device", "inputs", "platform", "serves", "held_back"):
            if entry[name] is None:
                del entry[name]
    return (header + yaml.safe_dump(data, sort_keys=True, default_flow_style=False)).encode()


class Pinned:
    """`build --locked`: the lock must come out of the build as it went in. Checked as early as
    each fact is known, so that the build stops before spending time on what the lock does not
    record: the plan (before anything runs), the source's digest once resolved, each node's key
    (before its stage runs), its artifact (once found or built), and last the whole lock (before
    it is written). An artifact built before the refusal stays in the store (content-addressed,
    named by no ref and no lock). With `--lock-out` (`targets` False: a CI job's slice, RECIPE.lock
    never written) only the recipe (check_locked) and the source are compared."""

    def __init__(self, path: Path, lock: LockFile, targets: bool = True):
        self.path, self.lock, self.targets = path, lock, targets

    def source(self, digest: str) -> None:
        pinned = (self.lock.source or {}).get("digest")
        if pinned and digest != pinned:
            raise LockMismatch(f"--locked: the source resolves to {digest[:16]}..., but {self.path} pins "
                               f"{pinned[:16]}...; rebuild without --locked")

    def planned(self, node_ids: set[str], validated: bool) -> None:
        """Before anything runs: the validation mode, and every entry a node of the recipe's graph."""
        if not self.targets:
            return
        if self.lock.validation != _validation(validated):
            raise LockMismatch(f"--locked: {self.path} records validation {self.lock.validation!r}; this build's is "
                               f"{_validation(validated)!r}; {LOCKED_ADVICE}")
        for tid, entry in sorted(self.lock.targets.items()):
            if tid not in node_ids:
                raise LockMismatch(f"--locked: {self.path} records {tid} as {entry.digest}; the recipe has no such "
                                   f"node; {LOCKED_ADVICE}")

    def before_building(self, node_id: str, key: str) -> None:
        """A node the store has not: its stage may run only under the key the lock records (then
        `done` compares the bytes it made)."""
        if not self.targets:
            return
        entry = self.lock.targets.get(node_id)
        if entry is None or entry.key != key:
            raise LockMismatch(f"--locked: {self._recorded(node_id, entry, key)}; this build's key {key} is not in "
                               f"the store (--locked builds only what the lock records); {LOCKED_ADVICE}")

    def done(self, node_id: str, key: str, digest: str, how: str) -> None:
        """A node's artifact, `how` this build got it (found, pulled, built): the lock's, under its key."""
        entry = self.lock.targets.get(node_id)
        if not self.targets or entry is not None and (entry.key, entry.digest) == (key, digest):
            return
        if entry is not None and entry.key == key:
            theirs = f"{how} {digest} under the same key {key}"
        else:
            theirs = f"{how} {digest} (key {key})"
        raise LockMismatch(f"--locked: {self._recorded(node_id, entry, key)}; this build {theirs}; {LOCKED_ADVICE}")

    def _recorded(self, node_id: str, entry: Optional[LockedTarget], key: str) -> str:
        if entry is None:
            return f"{self.path} has no {node_id}"
        if entry.key == key:
            return f"{self.path} records {node_id} as {entry.digest}"
        return f"{self.path} records {node_id} as {entry.digest} (key {entry.key})"

    def unchanged(self, lock: LockFile) -> None:
        """The lock this build would write: the first field it would change, both values named."""
        where = first_difference(self.lock, lock) if self.targets else None
        if where is not None:
            field, old, new = where
            raise LockMismatch(f"--locked: {self.path} records {field} as {old}; this build's is {new}; {LOCKED_ADVICE}")


def first_difference(old: LockFile, new: LockFile) -> Optional[tuple[str, str, str]]:
    """(the first field, in the lock's sorted order, whose value differs; the old value; the new),
    values as compact JSON (absent: `none`); None when the two locks are one."""
    a, b = _flat(old.model_dump(mode="json", by_alias=True)), _flat(new.model_dump(mode="json", by_alias=True))
    for name in sorted(a.keys() | b.keys()):
        if a.get(name) != b.get(name):
            return name, _shown(a.get(name)), _shown(b.get(name))
    return None


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """`targets.base-tp1.size` -> 431870; a mapping's leaves, a list is one value."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for name, value in data.items():
        if value is not None:
            out.update(_flat(value, f"{prefix}.{name}" if prefix else str(name)))
    return out


def _shown(value: Any) -> str:
    return "none" if value is None else value if isinstance(value, str) else canonical_json(value).decode()
