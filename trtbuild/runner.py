"""Walk a stage graph against a store: key hit -> done; miss -> run the stage in a fresh folder ->
ingest -> record. Two processes that want one key build it once (per-key lock, then re-check)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from trtbuild import hardware, keys, toolchain
from trtbuild.errors import InvalidInput, TrtbuildError
from trtbuild.graph import STAGE_ORDER, Graph, Node
from trtbuild.stages import source as sources
from trtbuild.stages.source import Resolved, SourceContext
from trtbuild.stages.base import StageContext
from trtbuild.stages.worker import ERROR_PREFIX, INPUT_ERROR_PREFIX, PROGRESS_PREFIX, load_entry
from trtbuild.store.checkout import materialize
from trtbuild.store.local import CorruptStore, LocalStore
from trtbuild.validate import gates

BUILT, CACHED, FAILED, IMPOSSIBLE, SKIPPED = "built", "cached", "failed", "impossible", "skipped"


@dataclass
class NodeResult:
    id: str
    kind: str
    stage: Optional[str]
    status: str
    key: Optional[str] = None
    digest: Optional[str] = None
    seconds: float = 0.0
    reason: Optional[str] = None
    path: Optional[str] = None
    summary: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.status in (BUILT, CACHED)

    def as_json(self) -> dict:
        out = {"name": self.id, "stage": self.stage or self.kind, "status": self.status, "key": self.key,
               "digest": self.digest, "seconds": round(self.seconds, 3), "reason": self.reason, "path": self.path}
        if "metrics" in self.summary:  # validation entries
            out.update(metrics=self.summary["metrics"], gates=self.summary.get("gates"),
                       warnings=self.summary.get("warnings", []))
        return out


@dataclass
class RunOptions:
    until: Optional[str] = None
    require_all: bool = False
    materialize: bool = False  # give every built or cached artifact a read-only `path`
    recipe_name: Optional[str] = None
    expected_source: Optional[str] = None  # --locked: the source digest the lock file pins
    lock_name: Optional[str] = None
    locked_source: Optional[dict] = None  # the lock file's source entry (offline hub builds use it)


class StageFailed(TrtbuildError):
    pass


class LockMismatch(InvalidInput):
    pass


class Silent:
    """Progress reporting that says nothing (library use, tests)."""

    def started(self, node: Node, what: str) -> "Silent":
        return self

    def advance(self, nbytes: int) -> None:
        pass

    def step(self, done: int, total: int, label: str) -> None:
        pass

    def finished(self, result: NodeResult) -> None:
        pass


# ---- keys ----------------------------------------------------------------------------------------

def resolved_platform(node: Node) -> dict[str, Any]:
    platform = dict(node.platform)
    if "device" in platform:  # the device calibrates differently: the key holds the real one
        platform["device"] = hardware.resolve_device(platform["device"])
    return platform


def resolve_source(node: Node, store: LocalStore, progress=None, locked: Optional[dict] = None) -> Resolved:
    """Identify what a source node reads (hashes through the stat cache, hub or bucket metadata):
    nothing is copied or converted. The lock entry names the source as the recipe does."""
    node.runtime.update(downloads=str(store.root / "downloads"), state_db=str(store.root / "index.db"))
    ctx = SourceContext(runtime=node.runtime, state=store.state, downloads=store.root / "downloads",
                        locked=locked, progress=progress)
    found = sources.resolve(ctx)
    node.runtime.update(found.runtime)
    lock = {"kind": node.runtime["kind"], "location": node.runtime["location"], "digest": found.digest, **found.lock}
    return Resolved(found.role, found.digest, lock, found.runtime, found.origin)


def key_fields(node: Node, input_digests: dict[str, str]) -> dict[str, Any]:
    stage = node.stage
    return {
        "stage": stage.name,
        "stage_version": stage.version,
        "inputs": input_digests,
        "params": node.param_values(),
        "toolchain": toolchain.fingerprint(stage.toolchain),
        "platform": resolved_platform(node),
    }


# ---- running one stage ---------------------------------------------------------------------------

def _failure_reason(log: Path, returncode: int) -> str:
    if returncode < 0:
        import signal

        name = signal.Signals(-returncode).name
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"stage process killed by {name}{hint}"
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith(INPUT_ERROR_PREFIX):
            raise InvalidInput(line[len(INPUT_ERROR_PREFIX):])
        if line.startswith(ERROR_PREFIX):
            return line[len(ERROR_PREFIX):]
    return f"stage process exited with status {returncode}"


def execute(node: Node, store: LocalStore, key: str, inputs: dict[str, Path], reporter) -> tuple[Any, dict, float]:
    """Run the node's stage into a fresh folder under the store's tmp/ and ingest the result."""
    stage = node.stage
    work = store.tmpdir(f"{node.kind}-{key[:12]}")
    out = work / "out"
    out.mkdir()
    started = time.monotonic()
    try:
        if stage.isolated:
            (out / "logs").mkdir()
            log = out / "logs" / f"{stage.name}.log"
            spec = {"entry": stage.entry, "out": str(out), "inputs": {k: str(v) for k, v in inputs.items()},
                    "params": node.param_values(), "runtime": node.runtime}
            (work / "spec.json").write_text(json.dumps(spec))
            with open(log, "wb") as handle:
                proc = subprocess.Popen([sys.executable, "-m", "trtbuild.stages.worker", str(work / "spec.json")],
                                        stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        preexec_fn=_die_with_parent)
                returncode = _follow(proc, log, reporter)
            if returncode != 0:
                try:
                    reason = _failure_reason(log, returncode)
                except InvalidInput as exc:  # still a stage that ran: its log is kept like any failure's
                    raise InvalidInput(f"{exc} (log: {_keep_failure(store, work, key)})") from None
                raise StageFailed(f"{reason} (log: {_keep_failure(store, work, key)})")
            manifest = store.ingest(out, progress=reporter.advance)
        else:
            ctx = StageContext(out=out, inputs=inputs, params=node.param_values(), runtime=node.runtime, state=store.state)
            try:
                load_entry(stage.entry)(ctx)
            except TrtbuildError:
                raise
            except Exception as exc:
                raise StageFailed(" ".join(f"{type(exc).__name__}: {exc}".split())) from exc
            if ctx.adopted is not None:
                manifest = store.ingest(ctx.adopted["folder"], progress=reporter.advance, include=ctx.adopted["include"],
                                        links_within=ctx.adopted["links_within"], link=ctx.adopted["link"])
            else:
                manifest = store.ingest(out, progress=reporter.advance)
        summary = {}
        report = out / "report.json"
        if report.exists():
            summary = json.loads(report.read_text())
        return manifest, summary, time.monotonic() - started
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _follow(proc: subprocess.Popen, log: Path, reporter) -> int:
    """Wait for a stage process, turning its progress lines into the reporter's bar."""
    offset = 0
    while True:
        try:
            returncode = proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            returncode = None
        with open(log, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk.rfind(b"\n") + 1
        offset += complete
        for line in chunk[:complete].decode(errors="replace").splitlines():
            if line.startswith(PROGRESS_PREFIX):
                counts, _, label = line[len(PROGRESS_PREFIX):].partition(" ")
                done, _, total = counts.partition("/")
                if done.isdigit() and total.isdigit():
                    reporter.step(int(done), int(total), label)
        if returncode is not None:
            return returncode


def _die_with_parent() -> None:
    """In the stage process: get SIGKILL if the runner dies, so no orphan keeps writing."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _keep_failure(store: LocalStore, work: Path, key: str) -> Path:
    """Keep a failed run's logs for inspection (not its partial output, which can be large):
    failed/<key>/ holds the latest failure of a key until `cache gc` sees the key built."""
    dest = store.root / "failed" / key
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(work / "out" / "logs", dest / "logs")
    return dest / "logs"


# ---- the walk ------------------------------------------------------------------------------------

def run_graph(graph: Graph, store: LocalStore, options: Optional[RunOptions] = None, reporter=None) -> tuple[list[NodeResult], dict[str, Resolved]]:
    options = options or RunOptions()
    reporter = reporter or Silent()
    results: dict[str, NodeResult] = {}
    resolutions: dict[str, Resolved] = {}
    with store.using():
        for node in graph.nodes:
            result = _run_node(graph, node, store, options, results, resolutions, reporter)
            results[node.id] = result
            reporter.finished(result)
    return [results[n.id] for n in graph.nodes], resolutions


def _run_node(graph: Graph, node: Node, store: LocalStore, options: RunOptions, results: dict[str, NodeResult],
              resolutions: dict[str, Resolved], reporter) -> NodeResult:
    result = NodeResult(node.id, node.kind, node.stage.name if node.stage else node.kind, SKIPPED)
    if node.impossible:
        result.status, result.reason = IMPOSSIBLE, node.impossible
        return result
    deps = [*node.inputs.values(), *node.after]
    failed = next((dep for dep in deps if results[dep].status == FAILED), None)
    if failed:
        result.status, result.reason = FAILED, f"needs {failed}, which failed"
        return result
    if options.until and STAGE_ORDER.get(node.kind, 99) > STAGE_ORDER[options.until]:
        result.reason = f"after --until {options.until}"
        return result
    pending = next((dep for dep in deps if not results[dep].done), None)
    if pending:  # this host's own reason first: it is what a reader must fix
        problem = node.requires() if node.requires else None
        waiting = f"needs {pending}, which was {results[pending].status}"
        result.reason = f"{problem}; and {waiting}" if problem else waiting
        return result
    if node.stage is None:  # a host that could not run the stage anyway says so first
        result.status = FAILED if options.require_all else SKIPPED
        result.reason = (node.requires() if node.requires else None) or node.unavailable
        return result

    started = time.monotonic()
    try:
        inputs = {role: results[dep].digest for role, dep in node.inputs.items()}
        if node.kind == "source":
            resolution = resolve_source(node, store, reporter.started(node, "resolving").advance, options.locked_source)
            if options.expected_source and resolution.digest != options.expected_source:
                raise LockMismatch(f"--locked: the source resolves to {resolution.digest[:16]}..., but "
                                   f"{options.lock_name} pins {options.expected_source[:16]}...; rebuild without --locked")
            resolutions[node.id] = resolution
            inputs[resolution.role] = resolution.digest
        if node.resolve is not None:
            inputs.update(node.resolve())
        fields = key_fields(node, inputs)
        key = keys.action_key(fields)
        result.key = key
        record = _hit(store, key)
        if record is None:
            problem = (node.requires() if node.requires else None) or node.stage.unavailable(fields["platform"])
            if problem:
                result.status = FAILED if options.require_all else SKIPPED
                result.reason = problem
                return result
            with store.key_lock(key):
                record = _hit(store, key)  # another process may have built it while we waited
                if record is None:
                    reporter.started(node, "building")
                    input_paths = {role: materialize(store, results[dep].digest) for role, dep in node.inputs.items()}
                    manifest, summary, seconds = execute(node, store, key, input_paths, reporter)
                    record = store.put_record({
                        "key": key, "digest": manifest.digest, "stage": node.stage.name,
                        "stage_version": node.stage.version, "target": node.id, "recipe": options.recipe_name or graph.recipe,
                        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "toolchain": fields["toolchain"], "seconds": round(seconds, 3), "summary": summary,
                        "size": manifest.size, "fields": fields,
                    })
                    result.status = BUILT
        if result.status != BUILT:
            result.status = CACHED
        result.digest = record["digest"]
        result.summary = record.get("summary", {})
        failed_gates = gates.failed_gates(result.summary)
        if options.materialize or failed_gates:  # checked out once, for the path and the report's place
            result.path = str(materialize(store, result.digest))
        if failed_gates:  # the report stays in the store for inspection; the target fails
            result.status, result.reason = FAILED, f"failed its gates: {', '.join(failed_gates)}; report: {result.path}/report.md"
        store.update_ref(graph.recipe, node.id, result.digest, key)
    except InvalidInput:  # a source that is not there, a lock that does not match: stop the run
        raise
    except (StageFailed, CorruptStore) as exc:
        result.status, result.reason = FAILED, str(exc)
    except TrtbuildError as exc:  # e.g. a source that cannot be read
        result.status, result.reason = FAILED, str(exc)
    finally:
        result.seconds = time.monotonic() - started
    return result


def _hit(store: LocalStore, key: str) -> Optional[dict]:
    record = store.get_record(key)
    if record is not None and store.has_manifest(record["digest"]):
        return record
    return None
