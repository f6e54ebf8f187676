"""Which runtime serves which Hugging Face (ModelOpt) checkpoint on which GPU, and the options it
needs: the reader of trtbuild/data/runtime-support.json, the one table of those facts. Every cell
there cites the upstream file and commit (or documentation page and version) it was read from;
docs/runtimes.md is generated from it (trtbuild.facts.runtimes_doc).

Conservative by rule: a cell the table marks `unclaimed` (not verified, or sources that disagree)
is not claimed (serves False, the reason says "not claimed" and why); a `fallback` cell serves with
a note. The runtime versions the table covers are explicit; any other is refused in one line.
Plain data, no torch or numpy: `plan` and `pullselect` import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtbuild.facts import gpus, quantformats
from trtbuild.errors import InvalidInput
from trtbuild.facts.runtime_names import ENGINE_RUNTIME, PULL_RUNTIMES, TABLE_FILE, names_text  # noqa: F401


class _Fact(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Runtime(_Fact):
    """One runtime that loads Hugging Face (ModelOpt) checkpoints."""

    title: str = Field(alias="name", description="as messages name it: 'TensorRT-LLM'")
    label: str = Field(description="as plan / ls text writes it: 'trtllm>=1.3'")
    package: str = Field(description="the distribution whose metadata says it is installed")
    text: str = Field(description="for people")
    versions: tuple[str, ...] = Field(description="the versions the table covers")
    default: str = Field(description="the version plan, check and the packaged commands use")
    version_note: str = Field(description="how `versions` cover releases (docs/runtimes.md)")
    older: Optional[str] = Field(None, description="why a version older than the table's oldest serves no "
                                 "hf-checkpoint (None: it is simply outside the table)")


class Source(_Fact):
    """Where a fact was read: a file of a repository at a commit (or ref), or a page at a version."""

    repo: Optional[str] = None
    ref: Optional[str] = None
    commit: Optional[str] = None
    path: Optional[str] = None
    url: Optional[str] = None
    version: Optional[str] = None
    where: str = Field(description="the place in the file or page")
    read_from: Optional[str] = Field(None, description="how it was read, where not from the file itself")


class _Row(_Fact):
    runtime: str
    versions: tuple[str, ...]
    cite: tuple[str, ...] = Field(min_length=1, description="the ids of `sources` that settle the row")
    read: Optional[str] = Field(None, description="what was read there, for people")


class SupportRow(_Row):
    """Whether `runtime` serves one format, by SM: the SMs that serve, those on a fallback, those not
    claimed; every other SM does not serve, for `reason`."""

    quant: Optional[str] = Field(None, description="weights: the format (quantformats.FORMATS), None: unquantized")
    kv_cache: Optional[str] = Field(None, description="KV cache rows: the format (quantformats.KV_FORMATS)")
    serves: tuple[str, ...] = ()
    reason: Optional[str] = None
    fallback: tuple[str, ...] = ()
    fallback_note: Optional[str] = None
    unclaimed: tuple[str, ...] = ()
    unclaimed_why: Optional[str] = None
    options: dict[str, str] = Field(default_factory=dict, description="what the runtime needs to be told")

    def sms(self) -> tuple[str, ...]:
        return self.serves + self.fallback + self.unclaimed


class LoaderRow(_Row):
    """The names a runtime's ModelOpt loader accepts."""

    quant_algos: tuple[str, ...] = Field(description="quant_algo names it loads")
    kv_cache_quant_algos: tuple[str, ...] = Field(description="kv_cache_quant_algo names it loads")
    known_algos: tuple[str, ...] = Field((), description="names it parses but has no loader for (TensorRT-LLM: "
                                         "QuantAlgo members without a linear method)")


class RuntimeTable(_Fact):
    """trtbuild/data/runtime-support.json: every cell cites its sources; checked when read."""

    schema_: int = Field(alias="schema")
    table_version: int = Field(description="hf-checkpoint keys record it: a changed fact re-packages")
    about: str
    runtimes: dict[str, Runtime]
    sources: dict[str, Source]
    weights: tuple[SupportRow, ...]
    kv_cache: tuple[SupportRow, ...]
    loaders: tuple[LoaderRow, ...]

    @model_validator(mode="after")
    def _consistent(self) -> "RuntimeTable":
        for section in ("weights", "kv_cache", "loaders"):
            for i, row in enumerate(getattr(self, section)):
                where = f"{section}: runtime {row.runtime!r}"
                if row.runtime not in self.runtimes:
                    raise ValueError(f"{where} is not one of {', '.join(self.runtimes)}")
                for version in row.versions:
                    if version not in self.runtimes[row.runtime].versions:
                        raise ValueError(f"{where}: version {version!r} is not one the table covers")
                for cite in row.cite:
                    if cite not in self.sources:
                        raise ValueError(f"{section}[{i}] cites {cite!r}, which is not one of its sources")
                for sm in row.sms() if isinstance(row, SupportRow) else ():
                    if sm not in gpus.SM_ARCHES:
                        raise ValueError(f"{section}[{i}]: {sm!r} is not an SM of trtbuild/data/{gpus.TABLE_FILE}")
        return self


@lru_cache(maxsize=None)
def table() -> RuntimeTable:
    """The table (trtbuild/data/runtime-support.json), checked."""
    return RuntimeTable.model_validate(json.loads(resources.files("trtbuild").joinpath("data", TABLE_FILE).read_text()))


TABLE_VERSION: int = table().table_version  # hf-checkpoint keys record it: a changed fact re-packages
RUNTIME_INFO: dict[str, Runtime] = dict(table().runtimes)
RUNTIMES = tuple(RUNTIME_INFO)
RUNTIME_NAMES = {name: r.title for name, r in RUNTIME_INFO.items()}
RUNTIME_LABELS = {name: r.label for name, r in RUNTIME_INFO.items()}


def _release(version: str) -> Optional[tuple[int, ...]]:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        return None


def covered_version(runtime: str, version: str) -> Optional[str]:
    """The table's version entry that covers `version` (an entry covers the versions whose release
    numbers begin with its own: "1.3" covers 1.3.0rc2 and 1.3.1, "0.33.0" only 0.33.0), or None."""
    release = _release(version)
    if release is None:
        return None
    for entry in RUNTIME_INFO[runtime].versions:
        own = _release(entry)
        if own is not None and release[:len(own)] == own and (len(own) < 3 or release == own):
            return entry
    return None


def oldest_version(runtime: str) -> str:
    """The oldest version the table covers: "1.3" for trtllm (its label, trtllm>=1.3). What asks
    for TensorRT-LLM's PyTorch backend (validate-trtllm, `pull`) asks for this one."""
    return min(RUNTIME_INFO[runtime].versions, key=lambda v: _release(v) or ())


def at_least_oldest(runtime: str, version: str) -> bool:
    """Whether `version` is the table's oldest (oldest_version) or a later one: "1.3" takes
    1.3.0rc2, 1.3.1 and 2.0; False for a version that does not parse."""
    release, oldest = _release(version), _release(oldest_version(runtime))
    return release is not None and oldest is not None and release[:len(oldest)] >= oldest


def outside_table(runtime: str, version: str) -> str:
    """The one line for a version the table does not cover."""
    r = RUNTIME_INFO[runtime]
    return (f"{runtime} {version} is outside the runtime table (trtbuild/data/{TABLE_FILE} covers "
            f"{runtime} {', '.join(r.versions)})")


def resolve_version(runtime: str, version: Optional[str] = None) -> str:
    """The table's entry for `version` (None: the runtime's default); InvalidInput, one line, when
    the table does not cover it."""
    if runtime not in RUNTIME_INFO:
        raise InvalidInput(f"unknown runtime {runtime!r}; one of {', '.join(RUNTIMES)}")
    if version is None:
        return RUNTIME_INFO[runtime].default
    entry = covered_version(runtime, version)
    if entry is None:
        raise InvalidInput(outside_table(runtime, version))
    return entry


def parse_runtime(spec: str) -> tuple[str, str]:
    """`vllm` or `vllm==0.26.0` -> (runtime, the table's version entry); InvalidInput otherwise."""
    name, _, version = spec.partition("==")
    if name not in RUNTIME_INFO:
        raise InvalidInput(f"runtime {name!r}: expected one of {', '.join(RUNTIMES)} (optionally NAME==VERSION)")
    return name, resolve_version(name, version or None)


@dataclass(frozen=True)
class Support:
    runtime: str
    sm: str
    serves: bool
    note: Optional[str] = None  # serves, on a fallback: what to know
    reason: Optional[str] = None  # does not serve (or not claimed): one clause
    cite: str = ""  # the table's source ids that settle it, comma-separated


@dataclass(frozen=True)
class _Cells:
    """One table row: the SMs that serve, those on a fallback, those not claimed; any other SM
    does not serve, for `reason`."""

    cite: str
    serves: frozenset = frozenset()
    reason: Optional[str] = None
    fallback: frozenset = frozenset()
    fallback_note: Optional[str] = None
    unclaimed: frozenset = frozenset()
    unclaimed_why: Optional[str] = None
    options: tuple = ()  # ((option, value), ...): what the runtime needs to be told

    @classmethod
    def of(cls, row: SupportRow) -> "_Cells":
        return cls(", ".join(row.cite), frozenset(row.serves), row.reason, frozenset(row.fallback), row.fallback_note,
                   frozenset(row.unclaimed), row.unclaimed_why, tuple(sorted(row.options.items())))

    def at(self, runtime: str, sm: str) -> Support:
        if sm in self.serves:
            return Support(runtime, sm, True, cite=self.cite)
        if sm in self.fallback:
            return Support(runtime, sm, True, note=self.fallback_note, cite=self.cite)
        if sm in self.unclaimed:
            return Support(runtime, sm, False, reason=f"not claimed: {self.unclaimed_why}", cite=self.cite)
        return Support(runtime, sm, False, reason=self.reason, cite=self.cite)


@lru_cache(maxsize=None)
def _rows(section: str, key: str) -> dict[tuple, _Cells]:
    """(runtime, version, format) -> cells, for the table's `weights` or `kv_cache` rows."""
    out = {}
    for row in getattr(table(), section):
        for version in row.versions:
            out[(row.runtime, version, getattr(row, key))] = _Cells.of(row)
    return out


def _weights(runtime: str, version: str, quant: Optional[str]) -> _Cells:
    return _rows("weights", "quant")[(runtime, version, quant)]


def _kv(runtime: str, version: str, kv_cache: str) -> _Cells:
    return _rows("kv_cache", "kv_cache")[(runtime, version, kv_cache)]


_KV_ONLY = "a KV-cache-only export (kv_cache_quant_algo without a quant_algo) is in no runtime's table"


def support(runtime: str, quant: Optional[str], kv_cache: Optional[str], sm: str,
            version: Optional[str] = None) -> Support:
    """Whether `runtime` (`version`, default: the table's default) serves the export of
    (quant, kv_cache) on `sm`, and why (not)."""
    if runtime not in RUNTIME_INFO:
        raise ValueError(f"unknown runtime {runtime!r}; one of {', '.join(RUNTIMES)}")
    if sm not in gpus.SM_ARCHES:
        raise ValueError(f"unknown SM {sm!r}; one of {', '.join(gpus.SM_ARCHES)}")
    version = resolve_version(runtime, version)
    if kv_cache is not None and not quantformats.KV_FORMATS[kv_cache].hf_export:
        return Support(runtime, sm, False, reason=f"{quantformats.KV_FORMATS[kv_cache].label} has no Hugging Face "
                                                  "checkpoint form", cite="trtbuild/facts/quantformats.py")
    if quant is None and kv_cache is not None:
        return Support(runtime, sm, False, reason=f"not claimed: {_KV_ONLY}")
    weights = _weights(runtime, version, quant).at(runtime, sm)
    if not weights.serves or kv_cache is None:
        return weights
    kv = _kv(runtime, version, kv_cache).at(runtime, sm)
    if not kv.serves:
        return kv
    notes = [n for n in (weights.note, kv.note) if n]
    return Support(runtime, sm, True, note="; ".join(notes) or None, cite=f"{weights.cite}; {kv.cite}")


def options(runtime: str, quant: Optional[str], kv_cache: Optional[str], version: Optional[str] = None) -> dict:
    """The options the table says `runtime` needs for (quant, kv_cache): {"quantization": ...,
    "kv_cache_dtype": ...}; a key is absent where the runtime needs nothing said."""
    version = resolve_version(runtime, version)
    out = dict(_weights(runtime, version, quant).options)
    if quant is not None and kv_cache is not None:
        out.update(_kv(runtime, version, kv_cache).options)
    return out


def serves_somewhere(runtime: str, quant: Optional[str], kv_cache: Optional[str], version: Optional[str] = None) -> bool:
    """Whether the table has any SM on which `runtime` serves (quant, kv_cache)."""
    return any(support(runtime, quant, kv_cache, sm, version).serves for sm in gpus.SM_ARCHES)


def _loader(runtime: str, version: Optional[str]) -> LoaderRow:
    version = resolve_version(runtime, version)
    for row in table().loaders:
        if row.runtime == runtime and version in row.versions:
            return row
    raise KeyError(f"the runtime table has no loader row for {runtime} {version}")


def loader_algos(runtime: str, version: Optional[str] = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(quant_algo names, kv_cache_quant_algo names) the runtime's ModelOpt loader accepts."""
    row = _loader(runtime, version)
    return row.quant_algos, row.kv_cache_quant_algos


def known_algos(runtime: str, version: Optional[str] = None) -> tuple[str, ...]:
    """The quant_algo names the runtime parses: those it loads and those it knows without a loader."""
    row = _loader(runtime, version)
    return row.quant_algos + row.known_algos


def _sorted(sms: Sequence[str]) -> list[str]:
    return sorted(dict.fromkeys(sms), key=gpus.sm_number)


def serving_sms(runtime: str, quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str],
                version: Optional[str] = None) -> list[str]:
    """The SMs of `sms` on which `runtime` (`version`, default: the table's) serves (quant, kv_cache), in SM order."""
    return [sm for sm in _sorted(sms) if support(runtime, quant, kv_cache, sm, version).serves]


def serves_text(quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> str:
    """`trtllm>=1.3 sm89 sm90; vllm sm89 sm90`, or `none`."""
    parts = []
    for runtime in RUNTIMES:
        serving = serving_sms(runtime, quant, kv_cache, sms)
        if serving:
            parts.append(" ".join([RUNTIME_INFO[runtime].label, *serving]))
    return "; ".join(parts) or "none"


def served_text(serves: dict[str, Sequence[str]]) -> str:
    """The same line from {runtime: [sm, ...]} (a loader check's verdict, as the lock keeps it)."""
    parts = [" ".join([RUNTIME_INFO[r].label, *_sorted(serves[r])]) for r in RUNTIMES if serves.get(r)]
    return "; ".join(parts) or "none"


def serve_notes(quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> dict[str, dict[str, str]]:
    """{runtime: {sm: note}} for the SMs of `sms` served on a fallback."""
    notes: dict[str, dict[str, str]] = {}
    for runtime in RUNTIMES:
        for sm in _sorted(sms):
            s = support(runtime, quant, kv_cache, sm)
            if s.serves and s.note:
                notes.setdefault(runtime, {})[sm] = s.note
    return notes


def format_label(quant: Optional[str], kv_cache: Optional[str]) -> str:
    """`INT8 SmoothQuant`, `FP8 with an FP8 KV cache`, `unquantized weights`."""
    weights = quantformats.FORMATS[quant].label if quant else "unquantized weights"
    return weights + (f" with {quantformats.KV_FORMATS[kv_cache].label}" if kv_cache else "")


def unservable_reason(quant: Optional[str], kv_cache: Optional[str], sms: Sequence[str]) -> Optional[str]:
    """None when some runtime serves (quant, kv_cache) on some SM of `sms`; else each runtime's reason:
    `no runtime serves INT8 SmoothQuant on sm89, sm90: trtllm>=1.3: ...; vllm: ...; sglang: ...`. A
    runtime whose reason differs by SM lists them: `sm80 sm86: ... / sm100: ...`."""
    ordered = _sorted(sms)
    parts = []
    for runtime in RUNTIMES:
        by_reason: dict[str, list[str]] = {}
        for sm in ordered:
            s = support(runtime, quant, kv_cache, sm)
            if s.serves:
                return None
            by_reason.setdefault(s.reason or "", []).append(sm)
        if len(by_reason) == 1:
            text = next(iter(by_reason))
        else:
            text = " / ".join(f"{' '.join(group)}: {reason}" for reason, group in by_reason.items())
        parts.append(f"{RUNTIME_INFO[runtime].label}: {text}")
    return f"no runtime serves {format_label(quant, kv_cache)} on {', '.join(ordered)}: " + "; ".join(parts)
