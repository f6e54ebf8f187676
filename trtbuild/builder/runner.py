"""Walk a stage graph against a store: key hit -> done; miss -> run the stage in a fresh folder ->
ingest -> record. Two processes that want one key build it once (per-key lock, then re-check).
A record whose artifact is damaged is never served: the key is rebuilt. Refs move last, and only
to artifacts that passed every validation of them that could run (`_ref_verdict` says which)."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import ValidationError

from trtbuild.builder import nodekeys
from trtbuild.builder import timingcache
from trtbuild.builder.refs import move_refs
from trtbuild.builder.results import BUILT, CACHED, FAILED, IMPOSSIBLE, SKIPPED, NodeResult, RunResult
from trtbuild.errors import InvalidInput, TrtbuildError, Unreachable
from trtbuild.builder.graph import STAGE_ORDER, Blocker, Graph, Node
from trtbuild.facts.nodeids import TARGET_STAGES
from trtbuild.store.platform import EnginePlatform
from trtbuild.store.base import first_error
from trtbuild.store.records import ActionRecord, Digest, Execution, utc_now
from trtbuild.store.summaries import EngineSummary, StageSummary, UnknownSummary, parse_summary
from trtbuild.builder.stages.base import OVERLAY_SUMMARY, SUMMARY_FILES, StageContext, StageRuntime
from trtbuild.builder.stages.source import Resolved
from trtbuild.builder.stages.worker import ERROR_PREFIX, INPUT_ERROR_PREFIX, PROGRESS_PREFIX, load_entry
from trtbuild.store.checkout import materialize
from trtbuild.store.local import CorruptStore, LocalStore
from trtbuild.store.tree import Manifest
from trtbuild.validate import gates
from trtbuild.builder.worker_pool import WorkerPool


@dataclass
class RunOptions:
    until: Optional[str] = None
    require_all: bool = False
    materialize: bool = False  # give every built or cached artifact a read-only `path` (targets always get one)
    validated: bool = True  # False: --no-validate (publication.held_back holds every target back)
    recipe_name: Optional[str] = None
    recipe_identity: Optional[str] = None  # claims refs/<recipe>/ for this recipe (see LocalStore.claim_recipe)
    pinned: Optional[object] = None  # --locked: lockfile.Pinned, which stops the run where the lock would change
    locked_source: Optional[dict] = None  # the lock file's source entry (offline hub builds use it)
    rebuild: frozenset[str] = frozenset()  # --rebuild: node ids built anew even when the store has them
    host_sms: Optional[frozenset[str]] = None  # --gpu auto: this host's SMs; nodes for others are another host's job
    remote: Optional[object] = None  # remote_cache.RemoteCache: where a local miss is looked up (and pulled from)


class StageFailed(TrtbuildError):
    def __init__(self, message: str, tail: Optional[list[str]] = None):
        super().__init__(message)
        self.tail = tail or []  # the last lines of the stage's log, for the build's output


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

    def notice(self, line: str) -> None:
        """A line the run says besides its results: a damaged artifact rebuilt, a wait for a lock."""


# ---- running one stage ---------------------------------------------------------------------------

@dataclass
class Executed:
    manifest: Manifest
    summary: Optional[StageSummary]
    execution: Execution


def _log_tail(log: Path, lines: int = 12) -> list[str]:
    """The last lines of a stage's log that are not trtbuild's own protocol lines."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    kept = [line for line in text if line.strip() and not line.startswith((ERROR_PREFIX, INPUT_ERROR_PREFIX, PROGRESS_PREFIX))]
    return kept[-lines:]


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


def execute(keyed: nodekeys.KeyedNode, store: LocalStore, inputs: dict[str, Path], reporter, pool: WorkerPool) -> Executed:
    """Run the node's stage into a fresh folder under the store's tmp/ and ingest the result. The
    stage's log is written beside that folder, not in it: it is stored as a blob of its own and
    named in the action record, so the artifact holds only what the key's inputs determine. An
    overlay stage's artifact is its input's plus what it wrote (_overlay)."""
    node, key = keyed.node, keyed.key
    stage = node.stage
    with store.workspace().work_folder(f"{node.kind}-{key[:12]}") as work:  # gone after, however it ends
        out = work / "out"
        out.mkdir()
        (work / "logs").mkdir()
        log = work / "logs" / f"{stage.name}.log"
        started = time.monotonic()
        peak_rss_mib, figures = None, {}
        # the stage may read (never change) what its key names: the platform, toolchain and input digests
        runtime = {**keyed.runtime, "platform": keyed.fields["platform"], "toolchain": keyed.fields["toolchain"],
                   "input_digests": keyed.fields["inputs"], "node": node.id}
        # an overlay stage's files go in as blobs only: its artifact is _overlay's merged manifest
        ingest = store.ingest_files if stage.overlay else store.ingest
        timing = _timing_cache(keyed, store, work) if stage.timing_cache else None
        if timing:
            runtime.update(timing.runtime)
        if stage.isolated:
            spec = {"entry": stage.entry, "out": str(out), "inputs": {k: str(v) for k, v in inputs.items()},
                    "params": node.param_values(), "runtime": StageRuntime.of(runtime).as_json(),
                    "execution": str(work / "execution.json")}
            (work / "spec.json").write_text(json.dumps(spec))
            returncode = pool.run(work / "spec.json", log, stage.shares_worker, reporter.step)
            if returncode != 0:
                try:
                    reason = _failure_reason(log, returncode)
                except InvalidInput as exc:  # still a stage that ran: its log is kept like any failure's
                    raise InvalidInput(f"{exc} (log: {store.workspace().keep_failure(key, work / 'logs')})") from None
                tail = _log_tail(log)
                raise StageFailed(f"{reason} (log: {store.workspace().keep_failure(key, work / 'logs')})", tail)
            measured = json.loads((work / "execution.json").read_text())
            peak_rss_mib, figures = measured["peak_rss_mib"], measured["figures"]
            summary = _typed_summary(stage.ident, out, inputs[stage.overlay] if stage.overlay else None)
            manifest = ingest(out, progress=reporter.advance)
        else:
            ctx = StageContext(out=out, inputs=inputs, params=node.param_values(), runtime=StageRuntime.of(runtime),
                               state=store.state)
            try:
                load_entry(stage.entry)(ctx)
            except TrtbuildError:
                raise
            except Exception as exc:
                raise StageFailed(" ".join(f"{type(exc).__name__}: {exc}".split())) from exc
            figures = ctx.figures
            summary = _typed_summary(stage.ident, out, inputs[stage.overlay] if stage.overlay else None)
            if ctx.adopted is not None:
                manifest = ingest(ctx.adopted["folder"], progress=reporter.advance, include=ctx.adopted["include"],
                                  links_within=ctx.adopted["links_within"], link=ctx.adopted["link"])
            else:
                manifest = ingest(out, progress=reporter.advance)
        if stage.overlay:
            manifest = _overlay(store, keyed.fields["inputs"][stage.overlay], manifest)
        if timing:
            timing.store_new(store)
        logs: dict[str, Digest] = {}
        if log.exists() and log.stat().st_size:
            logs[log.name] = store.put_file_blob(log)
        execution = Execution(seconds=round(time.monotonic() - started, 3), peak_rss_mib=peak_rss_mib,
                              host=socket.gethostname(), figures=figures, logs=logs)
        return Executed(manifest, summary, execution)


def _typed_summary(stage_id: str, out: Path, overlaid: Optional[Path] = None) -> Optional[StageSummary]:
    """The artifact's report as its stage kind's summary: a report the kind's model refuses fails
    the stage, in one line, before anything is stored."""
    try:
        return parse_summary(stage_id, _summary(out, overlaid))
    except (UnknownSummary, ValidationError) as exc:
        problem = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        raise StageFailed(f"the stage's report is not a {stage_id} summary: {problem}") from None


def _summary(out: Path, overlaid: Optional[Path] = None) -> dict:
    """The artifact's report, read before ingest takes the files. An overlay stage's is its input's
    report (`overlaid`, the input's folder) updated with the stage's own (OVERLAY_SUMMARY)."""
    if overlaid is None:
        report = next((out / name for name in SUMMARY_FILES if (out / name).exists()), None)
        return json.loads(report.read_text()) if report is not None else {}
    summary = _summary(overlaid)
    own = out / OVERLAY_SUMMARY
    if own.exists():
        summary.update(json.loads(own.read_text()))
    return summary


def _overlay(store: LocalStore, base_digest: str, written: Manifest) -> Manifest:
    """An overlay stage's artifact: its input's manifest (read from the store, never re-hashed: its
    blobs are already there) plus the files the stage wrote (`written`, blobs stored, manifest not),
    which may add files but replace none."""
    base = store.get_manifest(base_digest)
    clash = sorted({e.path for e in base.entries} & {e.path for e in written.entries})
    if clash:
        raise StageFailed(f"the stage wrote {', '.join(clash[:3])}, which its input {base_digest[:16]}... already has; "
                          "an overlay may add files, never replace them")
    merged = Manifest.from_entries(base.entries + written.entries)
    store.put_manifest(merged)
    return merged


@dataclass
class _TimingCache:
    """The timing cache of an engine build: the newest stored one fed in, the one written stored."""

    key: str
    runtime: dict
    folder: Path

    def store_new(self, store: LocalStore) -> None:
        if not any(self.folder.glob("*")):
            return
        manifest = store.ingest(self.folder)
        store.update_ref(timingcache.REFS, self.key, manifest.digest, self.key)


def _timing_cache(keyed: nodekeys.KeyedNode, store: LocalStore, work: Path) -> _TimingCache:
    from trtbuild.plan import engine_command

    fields = keyed.fields
    key = timingcache.cache_key(fields["platform"].get("sm"), fields["toolchain"],
                                engine_command.tactic_options(fields["params"]))
    folder = work / "timing-cache"
    runtime = {"timing_cache_out": str(folder), "timing_cache_key": key}
    ref = store.read_ref(timingcache.REFS, key)
    if ref is not None and store.artifact_problem(ref.digest) is None:  # a damaged one is simply not used
        runtime["timing_cache_in"] = str(materialize(store, ref.digest) / engine_command.TIMING_CACHE_OUT)
    return _TimingCache(key, runtime, folder)


# ---- the walk ------------------------------------------------------------------------------------

def run_graph(graph: Graph, store: LocalStore, options: Optional[RunOptions] = None, reporter=None) -> RunResult:
    options = options or RunOptions()
    reporter = reporter or Silent()
    results: dict[str, NodeResult] = {}
    resolutions: dict[str, Resolved] = {}
    with store.using(say=reporter.notice), WorkerPool() as pool:
        if options.recipe_identity:  # refused before anything runs; claimed once refs move
            store.check_claim(graph.recipe, options.recipe_identity)
        for node in graph.nodes:
            result = _run_node(graph, node, store, options, results, resolutions, reporter, pool)
            results[node.id] = result
            reporter.finished(result)
        if options.recipe_identity and any(r.done for r in results.values()):
            store.claim_recipe(graph.recipe, options.recipe_identity)
        move_refs(graph, store, results, options.validated)
    return RunResult([results[n.id] for n in graph.nodes], resolutions)


def _run_node(graph: Graph, node: Node, store: LocalStore, options: RunOptions, results: dict[str, NodeResult],
              resolutions: dict[str, Resolved], reporter, pool: WorkerPool) -> NodeResult:
    result = NodeResult(node.id, node.kind, node.stage.name if node.stage else node.kind, SKIPPED)
    ruled_out = node.ruled_out()
    if ruled_out and ruled_out.kind == Blocker.PLAN:
        result.status, result.reason = IMPOSSIBLE, ruled_out.reason
        return result
    deps = [*node.inputs.values(), *node.after]
    failed = next((dep for dep in deps if results[dep].status == FAILED), None)
    if failed:
        result.status, result.reason = FAILED, f"needs {failed}, which failed"
        return result
    if options.until and STAGE_ORDER.get(node.kind, 99) > STAGE_ORDER[options.until]:
        result.reason = f"after --until {options.until}"
        return result
    sm = node.platform["sm"].value if "sm" in node.platform else None
    if sm and options.host_sms is not None and sm not in options.host_sms:  # skipped even with --require-all
        here = ", ".join(sorted(options.host_sms)) or "no GPU"
        result.reason = f"for {sm}: --gpu auto builds only this host's SMs ({here})"
        if node.kind == "engine":
            result.reason = f"needs an {sm} GPU: --gpu auto builds only this host's SMs ({here})"
        return result
    if ruled_out:  # no stage at all comes before anything a host could change
        result.status = FAILED if options.require_all else SKIPPED
        result.reason = ruled_out.reason
        return result
    pending = next((dep for dep in deps if not results[dep].done), None)
    if pending:  # this host's own reason first: it is what a reader must fix
        problem = node.host_problem()
        waiting = f"needs {pending}, which was {results[pending].status}"
        result.reason = f"{problem.reason}; and {waiting}" if problem else waiting
        return result

    started = time.monotonic()
    try:
        input_digests = {role: results[dep].digest for role, dep in node.inputs.items()}
        keyed = nodekeys.key_node(node, input_digests, store, options.locked_source,
                                  reporter.started(node, "resolving").advance if node.kind == "source" else None)
        if keyed.resolution is not None:
            if options.pinned:
                options.pinned.source(keyed.resolution.digest)
            resolutions[node.id] = keyed.resolution
        result.key = keyed.key
        rebuild = node.id in options.rebuild
        # a local miss is looked up in the remote (pulled, verified): a hit either way, from where it was found
        found = nodekeys.lookup(store, keyed.key, None if rebuild else options.remote)
        result.note = "; ".join(found.notes) or None
        if found.pulled_from:
            result.pulled = {"store": found.pulled_from, **found.pulled}
        if rebuild or not found.hit:
            problem = node.host_problem()
            if problem:  # a host without the hardware skips; an install without the packages fails
                fails = options.require_all or found.problem or problem.kind == Blocker.INSTALL
                result.status = FAILED if fails else SKIPPED
                result.blocker = problem.kind
                result.reason = (f"the stored artifact is damaged ({found.problem}) and {problem.reason}" if found.problem
                                 else problem.reason)
                return result
            if options.pinned:  # --locked: no stage runs under a key the lock does not record
                options.pinned.before_building(node.id, keyed.key)
            with store.workspace().key_lock(keyed.key, waiter=node.id, say=reporter.notice):
                found = nodekeys.lookup(store, keyed.key)  # another process may have built it while we waited
                if found.problem:  # never silent: a damaged store is something to look into
                    reporter.notice(f"{node.id}: rebuilding {found.record.digest[:12]}: the stored artifact is "
                                    f"damaged ({found.problem})")
                if rebuild or not found.hit:
                    reporter.started(node, "rebuilding" if found.problem or rebuild else "building")
                    input_paths = {role: materialize(store, results[dep].digest) for role, dep in node.inputs.items()}
                    done = execute(keyed, store, input_paths, reporter, pool)
                    record = ActionRecord(
                        key=keyed.key, artifact=Digest(hash=done.manifest.digest, size_bytes=done.manifest.size),
                        stage=node.stage.ident, stage_version=node.stage.version, target=node.id,
                        recipe=options.recipe_name or graph.recipe,
                        created=utc_now(),
                        toolchain=keyed.fields["toolchain"], summary=done.summary, fields=keyed.fields,
                        execution=done.execution)
                    # a damaged or unwanted first artifact gives way; otherwise the first one stays
                    found = nodekeys.Lookup(store.put_record(record, replace=rebuild or found.problem is not None))
                    result.status = BUILT
        if result.status != BUILT:
            result.status = CACHED
        result.origin = "built" if result.status == BUILT else "remote" if result.pulled else "local"
        result.digest, result.size = found.record.digest, found.record.size
        if options.pinned:  # --locked: the artifact must be the lock's (refs have not moved yet)
            how = {"built": "built", "remote": "pulled"}.get(result.origin, "found")
            options.pinned.done(node.id, keyed.key, result.digest, how)
        result.summary = found.record.summary
        result.standin = found.record.standin
        result.platform = _platform(node, found.record)
        failed_gates = gates.failed_gates(result.summary)
        target = node.kind in TARGET_STAGES and node.serves is None  # a plain build prints where each target is
        if options.materialize or target or failed_gates:  # checked out once (then a stat), for the path
            result.path = str(materialize(store, result.digest))
        if failed_gates:  # the report stays in the store for inspection; the target fails
            result.status, result.reason = FAILED, f"failed its gates: {', '.join(failed_gates)}; report: {result.path}/report.md"
    except (InvalidInput, Unreachable):  # a source that is not there, a hub not reached, a lock that does not match: stop the run
        raise
    except StageFailed as exc:
        result.status, result.reason, result.log_tail = FAILED, str(exc), exc.tail
    except CorruptStore as exc:
        result.status, result.reason = FAILED, str(exc)
    except TrtbuildError as exc:  # e.g. a source that cannot be read
        result.status, result.reason = FAILED, str(exc)
    finally:
        result.seconds = time.monotonic() - started
    return result


def _platform(node: Node, record: ActionRecord) -> Optional[EnginePlatform]:
    """What a deploy host compares with itself before using an engine (the lock file keeps it)."""
    if node.kind != "engine" or not isinstance(record.summary, EngineSummary):
        return None
    return record.summary.platform(standin=bool(record.standin))
