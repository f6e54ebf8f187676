"""`trtbuild ls`: what a store publishes (its refs), with sizes, validation headline numbers (and
the runner and device that measured them), toolchain and age; with --compatible, whether each target fits this host (after NVIDIA NIM's
`list-model-profiles`), judged by the same rules as `pull --target auto` (pullselect.choose).

Everything comes from the store: a ref names the artifact, its action record the stage, size,
toolchain, creation time and, for a validation, the metrics. No lock file is needed, so a deploy
host can look at a bucket before it has any checkout.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Optional

from trtbuild.facts import serving
from trtbuild.facts.serving import ENGINE_RUNTIME
from trtbuild.plan.estimate import format_bytes
from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile
from trtbuild.facts.nodeids import (checkpoint_of_engine, is_target, trtllm_validate_id, validate_id, variant_of,
                              vllm_validate_id)
from trtbuild.deploy.select import Host, choose, served_on
from trtbuild.facts.runtime_names import LLAMACPP_RUNTIME
from trtbuild.store.platform import EnginePlatform
from trtbuild.store.records import ActionRecord, Ref, format_utc
from trtbuild.store.summaries import EngineSummary, GgufSummary, HfCheckpointSummary, ValidationSummary, kind_of
from trtbuild.store.base import Store
from trtbuild.validate import gates

HEADLINE = ("kld_mean", "top1_agreement", "ppl_delta_pct")  # the validation numbers ls shows


@dataclass
class Validation:
    id: str
    metrics: dict  # the headline numbers (None where the record has none)
    gates_passed: bool
    runner: Optional[str] = None  # as its report names it: `torch`, `tensorrt_llm VERSION`, `vllm VERSION`
    device: Optional[str] = None  # what that runner computed on, as it said
    standin: list[str] = field(default_factory=list)  # toolchain parts of the validation that were stand-ins

    def as_json(self) -> dict:
        return {"id": self.id, **self.metrics, "gates_passed": self.gates_passed, "runner": self.runner,
                "device": self.device}


@dataclass
class Published:
    """One published target: its ref, the record behind it, and (with --compatible) its fit."""

    recipe: str
    target: str
    ref: Ref
    record: Optional[ActionRecord]  # None: the ref's key has no record (or one of another artifact) in the store
    size: Optional[int]
    validations: list[Validation] = field(default_factory=list)
    fits: Optional[bool] = None  # None: not judged (no --compatible)
    runtime: Optional[str] = None
    world_size: Optional[int] = None
    reasons: list[str] = field(default_factory=list)
    measurements: list = field(default_factory=list)  # its bench records (trtbuild/store/measurements.py), oldest first

    @property
    def stage(self) -> Optional[str]:
        # a record's stage is the registry id (`checkpoint:export`); the kind is what comes before ':'
        return kind_of(self.record.stage) if self.record else None

    @property
    def toolchain(self) -> dict[str, str]:
        """The versions that made it: the key's, and what the stage's probe found (an image's)."""
        if self.record is None:
            return {}
        probed = self.record.summary.toolchain.model_dump() if isinstance(self.record.summary, EngineSummary) else {}
        merged = {**self.record.toolchain, **probed}
        return {k: str(v) for k, v in sorted(merged.items()) if v is not None}

    @property
    def standin(self) -> list[str]:
        return self.record.standin if self.record else []

    @property
    def serves(self) -> Optional[dict[str, list[str]]]:
        """An hf-checkpoint's loader check: runtime -> the SMs it serves it on (its package record);
        an engine's SM under `trtllm-engine`; a GGUF's `llamacpp` with no SM (its packaged server runs
        llama.cpp on the CPU)."""
        summary = self.record.summary if self.record is not None else None
        if isinstance(summary, EngineSummary):
            return {ENGINE_RUNTIME: [summary.sm]}
        if isinstance(summary, GgufSummary):
            return {LLAMACPP_RUNTIME: []}
        return summary.serving.serves if isinstance(summary, HfCheckpointSummary) else None

    @property
    def created(self) -> Optional[dt.datetime]:
        return self.record.created if self.record else None

    def as_json(self, now: dt.datetime) -> dict:
        return {"recipe": self.recipe, "target": self.target, "stage": self.stage, "digest": self.ref.digest,
                "key": self.ref.key, "size_bytes": self.size,
                "created": format_utc(self.created) if self.created else None,
                "age_seconds": _age_seconds(self.created, now), "toolchain": self.toolchain, "standin": self.standin,
                "serves": self.serves, "validations": [v.as_json() for v in self.validations], "fits": self.fits, "runtime": self.runtime,
                "world_size": self.world_size, "reasons": self.reasons,
                "measurements": [measurement_json(r) for r in self.measurements]}


def measurement_json(record) -> dict:
    """One bench record as ls --json summarizes it: where and how it was measured, and its headline figures."""
    f, p = record.figures, record.platform
    return {"runtime": record.runtime, "runtime_version": record.runtime_version, "device": p.device,
            "product": p.product, "sm": p.sm, "gpus": p.count, "workload": record.workload,
            "concurrency": record.workload_spec.get("concurrency"), "output_tok_s": f.output_token_throughput,
            "request_throughput": f.request_throughput, "ttft_p50_ms": f.ttft_ms.p50, "tpot_p50_ms": f.tpot_ms.p50,
            "e2el_p50_ms": f.e2el_ms.p50, "e2el_p99_ms": f.e2el_ms.p99, "time_to_ready_s": record.time_to_ready_s,
            "created": format_utc(record.created), "host": record.host, "standin": record.standin}


def _is_target(target: str, record: Optional[ActionRecord]) -> bool:
    """Checkpoints, hf-checkpoints, engines and GGUF files, not the nodes derived from them (nodeids.is_target).
    Without a record, the name says it (`<variant>-tp1`, `-hf`; not `source`, `reference`)."""
    return is_target(target, record.stage.split(":")[0]) if record else variant_of(target) is not None


def platform_of(record: ActionRecord) -> Optional[EnginePlatform]:
    """An engine's platform from its record's summary (its trtbuild.json), as a lock keeps it."""
    if not isinstance(record.summary, EngineSummary):
        return None  # a record without those facts: choose() says the platform is unknown
    return record.summary.platform(standin=bool(record.standin))


def _validation_ids(target: str, record: Optional[ActionRecord]) -> list[str]:
    """A target's validations in the order their figures decide (refs.DECIDING_ORDER): its own
    first, the serving runtime's before torch's (TensorRT-LLM's, vLLM's, then torch's; an engine's
    own is TensorRT-LLM's); an engine's also its checkpoint's, last (as verdict.lock_validations)."""
    ids = [trtllm_validate_id(target), vllm_validate_id(target), validate_id(target)]
    platform = platform_of(record) if record is not None and record.stage.startswith("engine") else None
    if platform is not None:
        ids.append(validate_id(checkpoint_of_engine(target, platform.sm)))
    return ids


def _validation(vid: str, record: ActionRecord) -> Validation:
    summary = record.summary
    if not isinstance(summary, ValidationSummary):  # a validation that wrote no report
        return Validation(vid, dict.fromkeys(HEADLINE), True, standin=record.standin)
    metrics = summary.metrics.model_dump()
    return Validation(vid, {name: metrics[name] for name in HEADLINE}, not gates.failed_gates(summary),
                      summary.runner, summary.device, standin=record.standin)


def list_published(store: Store, recipe: Optional[str] = None) -> list[Published]:
    """Every published target of the store (or of one recipe name), sorted by recipe then target."""
    refs = {(r, t): ref for r, t, ref in store.refs() if recipe is None or r == recipe}
    records: dict[str, Optional[ActionRecord]] = {}

    def record_of(ref: Ref) -> Optional[ActionRecord]:
        if ref.key not in records:
            found = store.get_record(ref.key)
            records[ref.key] = found if found is not None and found.digest == ref.digest else None
        return records[ref.key]

    out = []
    for (name, target), ref in sorted(refs.items()):
        record = record_of(ref)
        if not _is_target(target, record):
            continue
        size = record.size if record else (store.get_manifest(ref.digest).size if store.has_manifest(ref.digest) else None)
        item = Published(name, target, ref, record, size, measurements=store.bench_records(ref.digest))
        for vid in _validation_ids(target, record):
            vref = refs.get((name, vid))
            vrecord = record_of(vref) if vref else None
            if vrecord is not None:
                item.validations.append(_validation(vid, vrecord))
        out.append(item)
    return out


def judge(published: list[Published], host: Host, variant_order: Optional[list[str]] = None) -> None:
    """Mark each target's fit on `host`: pullselect.choose over a lock made of each recipe's refs."""
    by_recipe: dict[str, list[Published]] = {}
    for item in published:
        by_recipe.setdefault(item.recipe, []).append(item)
    for name, items in by_recipe.items():
        targets, formats = {}, {}
        for item in items:
            if item.record is None:
                item.fits, item.reasons = False, ["record: the store has no action record of this artifact"]
                continue
            platform = platform_of(item.record) if item.stage == "engine" else None
            targets[item.target] = LockedTarget(stage=item.stage, key=item.ref.key, digest=item.ref.digest,
                                                size=item.size or 0, platform=platform,
                                                serves=item.serves if item.stage == "hf-checkpoint" else None)
            params = item.record.fields.params
            formats[item.target] = (params.get("quant"), params.get("kv_cache"))
        lock = LockFile(recipe=LockedRecipe(name=name, digest=""), source=None, toolchain={}, targets=targets,
                        validation="run")
        selection = choose(lock, host, formats=lambda tid, _, known=formats: known[tid], variant_order=variant_order,
                           published_only=False)  # a ref is what the store publishes
        found = {c.target: c for c in selection.candidates}
        for item in items:
            cand = found.get(item.target)
            if cand is not None:
                item.fits, item.runtime, item.world_size = cand.fits, cand.runtime, cand.world_size
                item.reasons = cand.reasons
            if item.standin and item.stage != "engine":  # choose() names an engine's stand-in; others are never served
                item.fits, item.runtime, item.world_size = False, None, None
                stand_in = f"made by a stand-in toolchain ({', '.join(item.standin)}): never for real use"
                item.reasons = [stand_in, *item.reasons]
            measured = [v for v in item.validations if v.standin]
            if measured:  # figures a stand-in computed never pass for a real runtime's
                item.fits, item.runtime, item.world_size = False, None, None
                item.reasons = [f"validated by a stand-in ({measured[0].id}: {', '.join(measured[0].standin)}): "
                                "never for real use", *item.reasons]


# ---- the table -------------------------------------------------------------------------------------

def utc_now() -> dt.datetime:
    """The time ages are counted to (one place, so a test can fix it)."""
    return dt.datetime.now(dt.timezone.utc)


def _age_seconds(created: Optional[dt.datetime], now: dt.datetime) -> Optional[int]:
    return None if created is None else max(0, int((now - created).total_seconds()))


def format_age(seconds: Optional[int]) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _headline(item: Published) -> tuple[str, str, str, str]:
    """KL mean, top-1 agreement and perplexity change of the target's first validation (the one
    whose figures decide), and who measured them: `RUNNER on DEVICE`, `(of CHECKPOINT)` when they
    are an engine's checkpoint's."""
    if not item.validations:
        return "-", "-", "-", "-"
    first = item.validations[0]
    m = first.metrics
    kl = f"{m['kld_mean']:.4g}" if isinstance(m["kld_mean"], (int, float)) else "-"
    top1 = f"{m['top1_agreement'] * 100:.1f}%" if isinstance(m["top1_agreement"], (int, float)) else "-"
    ppl = f"{m['ppl_delta_pct']:+.2f}%" if isinstance(m["ppl_delta_pct"], (int, float)) else "-"
    by = (first.runner or "?") + (f" on {first.device}" if first.device else "")
    of = first.id.rsplit(":", 1)[0]
    return kl, top1, ppl, by if of == item.target else f"{by} (of {of})"


def _toolchain_cell(item: Published) -> str:
    text = ", ".join(f"{k} {v}" for k, v in item.toolchain.items()) or "-"
    return f"STAND-IN {text}" if item.standin else text


def _serves_cell(item: Published) -> str:
    """`trtllm>=1.3 sm89 sm90; vllm sm89 sm90` for an hf-checkpoint, the SM for an engine,
    `llamacpp cpu` for a GGUF, else -."""
    serves = item.serves
    if not serves:
        return "-"
    if item.stage == "engine":
        return " ".join(serves[ENGINE_RUNTIME])
    if item.stage == "gguf":
        return f"{LLAMACPP_RUNTIME} cpu"
    return serving.served_text(serves)


def _fit_cell(item: Published) -> str:
    if item.fits:
        return f"yes ({item.runtime}, {served_on(item.runtime, item.world_size)})"
    return "no: " + "; ".join(item.reasons)


def _load(record) -> str:
    return f"{record.runtime}, {record.platform.product}, {record.workload}@{record.workload_spec.get('concurrency')}"


def _serving_cell(item: Published) -> str:
    """The best of its measured figures, each with where it was measured: `910 tok/s (vllm, NVIDIA H200,
    chat-short@8); TTFT p50 11 ms (...); E2EL p99 270 ms (...)`, or - when it has none."""
    records = [r for r in item.measurements if not r.standin]
    if not records:
        return "-"
    fast = max(records, key=lambda r: r.figures.output_token_throughput)
    first = min(records, key=lambda r: r.figures.ttft_ms.p50)
    tail = min(records, key=lambda r: r.figures.e2el_ms.p99)
    return (f"{fast.figures.output_token_throughput:.1f} tok/s ({_load(fast)}); "
            f"TTFT p50 {first.figures.ttft_ms.p50:.1f} ms ({_load(first)}); "
            f"E2EL p99 {tail.figures.e2el_ms.p99:.1f} ms ({_load(tail)})")


def table_lines(published: list[Published], now: dt.datetime, compatible: bool = False) -> list[str]:
    """Aligned columns, one row per target; a SERVING column of measured figures when any target has
    some; with `compatible`, a FITS column last."""
    measured = any(item.measurements for item in published)
    header = ["RECIPE", "TARGET", "STAGE", "SIZE", "KL", "TOP-1", "PPL", "MEASURED BY", "AGE", "SERVES",
              *(["SERVING (MEASURED)"] if measured else []), "TOOLCHAIN"]
    rows = []
    for item in published:
        kl, top1, ppl, by = _headline(item)
        row = [item.recipe, item.target, item.stage or "?", format_bytes(item.size) if item.size is not None else "-",
               kl, top1, ppl, by, format_age(_age_seconds(item.created, now)), _serves_cell(item),
               *([_serving_cell(item)] if measured else []), _toolchain_cell(item)]
        if compatible:
            row.append(_fit_cell(item))
        rows.append(row)
    if compatible:
        header.append("FITS")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]).rstrip() for r in [header, *rows]]


@dataclass
class Listing:
    """What `trtbuild ls` shows: docs/schemas/ls.schema.json (as_json), or table_lines."""

    store: str
    recipe: Optional[str]  # only this recipe's targets; None: the whole store's
    published: list[Published]
    host: Optional[Host] = None  # --compatible: the host each target was judged against
    now: dt.datetime = field(default_factory=lambda: utc_now())

    def as_json(self) -> dict:
        return {"store": self.store, "recipe": self.recipe, "host": self.host.as_json() if self.host else None,
                "published": [p.as_json(self.now) for p in self.published]}


def list_store(recipe, store_url: Optional[str] = None, compatible: bool = False) -> Listing:
    """`trtbuild ls [RECIPE]`: what --store (else RECIPE's publish.store) publishes, of RECIPE only
    when one is given; `compatible`: each judged against this host (the rules of `pull`)."""
    from trtbuild.deploy.shared import shared_store
    from trtbuild.errors import InvalidInput
    from trtbuild.recipe.schema import load_recipe
    from trtbuild.store.local import open_store

    loaded = load_recipe(recipe) if recipe is not None else None
    if loaded is not None:
        store_url = shared_store(store_url, loaded, "list")
    elif not store_url:
        raise InvalidInput("ls: no store to list: pass --store URL (or a RECIPE whose `publish.store` names one)")
    store = open_store(store_url)
    listing = Listing(store_url, loaded.recipe.name if loaded else None,
                      list_published(store, loaded.recipe.name if loaded else None))
    if compatible:
        listing.host = Host.probe()
        judge(listing.published, listing.host, list(loaded.recipe.variants) if loaded else None)
    listing.now = utc_now()
    return listing
