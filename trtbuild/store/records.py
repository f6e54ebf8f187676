"""The store's typed records: what an action produced (ActionRecord), what a name points at (Ref).

Each record has a `schema` version and one pydantic model that every writer and reader uses
(runner, store, gc, verify, `cache ls`, the report). After Bazel's remote-execution API: a `Digest`
travels with its size; an `ActionRecord` (Bazel's ActionResult) names the artifact it produced and,
apart from it, how the run went: seconds, peak memory, host and the digests of its logs. Those
belong here and never in the artifact, whose bytes must be a function of the key's inputs.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, BaseModel, ConfigDict, Field, PlainSerializer, \
    ValidationError, ValidationInfo, field_serializer, field_validator

from trtbuild.store.errors import CorruptStore
from trtbuild.store.summaries import StageSummary, dump_summary, parse_summary

RECORD_SCHEMA = 1
REF_SCHEMA = 1


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.timezone.utc)


def _parsed(value: Any) -> Any:
    """RFC 3339 text as a datetime (JSON has no datetime of its own, and records are read strictly)."""
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an RFC 3339 time") from None
    return value


# A moment in UTC: read from RFC 3339 text with any offset, written as `2026-12-01T19:22:01Z`
# (whole seconds, as every record and ref has been written).
UtcTime = Annotated[AwareDatetime, BeforeValidator(_parsed), AfterValidator(_utc),
                    PlainSerializer(lambda moment: format_utc(moment), return_type=str, when_used="json")]


def format_utc(moment: dt.datetime) -> str:
    """A moment as records, refs and `--json` outputs write it (RFC 3339, UTC, `Z`)."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now() -> dt.datetime:
    """Now, in UTC, to the second (a record's `created`, a ref's `time`)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


class Digest(BaseModel):
    """A content address: sha256 of the bytes (for an artifact: of its manifest) and their size."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    hash: str = Field(description="Lowercase hex sha256.", pattern=r"^[0-9a-f]{64}$")
    size_bytes: int = Field(ge=0, description="Size of the bytes named; for an artifact, the sum of its files' sizes.")


class Execution(BaseModel):
    """How one run of the stage went: figures that differ between hosts and runs, so never keyed
    and never part of the artifact."""

    model_config = ConfigDict(extra="forbid")
    seconds: float = Field(ge=0, description="Wall-clock time of the stage, ingest included.")
    peak_rss_mib: Optional[float] = Field(None, description="Peak resident memory of the stage process (MiB); "
                                          "None for stages run inside the runner.")
    host: str = Field(description="Host name of the machine that ran it.")
    figures: dict[str, Any] = Field(default_factory=dict,
                                    description="Stage-specific measurements (e.g. calibration seconds).")
    logs: dict[str, Digest] = Field(default_factory=dict,
                                    description="Log name -> blob holding its bytes (stdout and stderr of the stage).")


class KeyFields(BaseModel):
    """Everything an action key is computed from (keys.KEY_FIELDS, in that order), as the record keeps
    it: `keys.action_key` of these is the record's key. builder/nodekeys.py makes them, with the origin
    of each for `explain`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: str = Field(description="The stage's name (`checkpoint`, `engine`, ...).")
    stage_version: int = Field(description="The version of the stage's code.")
    inputs: dict[str, str] = Field(description="Role -> digest of each input artifact, of a source's files, or of a "
                                               "keyed text.")
    params: dict[str, Any] = Field(description="Exactly what the stage is handed, defaults filled in (the "
                                               "stage's own parameters: `quant`, `kv_cache`, limits, flags, ...).")
    toolchain: dict[str, Any] = Field(description="The toolchain parts the stage declares, with the versions found "
                                                  "(or the image digest that pins them).")
    platform: dict[str, Any] = Field(description="What the artifact is tied to: an engine's SM, the calibration "
                                                 "device; empty for a stage tied to none.")


class ActionRecord(BaseModel):
    """ac/<key>.json: the key, the artifact made under it, and how it was made."""

    model_config = ConfigDict(extra="forbid")
    schema_: int = Field(RECORD_SCHEMA, alias="schema", description="Version of this record's layout.")
    key: str = Field(pattern=r"^[0-9a-f]{64}$", description="The action key (keys.action_key of `fields`).")
    artifact: Digest = Field(description="The artifact: digest of its manifest and its total size.")
    stage: str = Field(description="Stage that made it (e.g. `checkpoint:export`).")
    stage_version: int = Field(description="Version of the stage's code, part of the key.")
    target: str = Field(description="Graph node it was built for, in the recipe that first built it.")
    recipe: str = Field(description="Name of the recipe that first built it.")
    created: UtcTime = Field(description="UTC time the record was written (RFC 3339, `Z`).")
    toolchain: dict[str, Optional[str]] = Field(default_factory=dict,
                                                description="Package versions the key holds for this stage.")
    summary: Optional[StageSummary] = Field(None, description="The stage's report (report.json, an engine's "
                                            "trtbuild.json; part of the artifact too), typed by the stage's kind "
                                            "(store.summaries); None, `{}` on disk, for a stage that wrote none.")
    fields: KeyFields = Field(description="Everything the key was computed from.")
    execution: Execution = Field(description="How the run went (timings, memory, host, logs).")

    @field_validator("summary", mode="before")
    @classmethod
    def _typed_summary(cls, summary: Any, info: ValidationInfo) -> Any:
        """The summary's model is the record's stage kind's (summaries.parse_summary)."""
        return parse_summary(str(info.data.get("stage")), summary)

    @field_serializer("summary")
    def _summary_as_written(self, summary: Optional[StageSummary]) -> dict[str, Any]:
        return dump_summary(summary)

    @property
    def digest(self) -> str:
        return self.artifact.hash

    @property
    def size(self) -> int:
        return self.artifact.size_bytes

    @property
    def standin(self) -> list[str]:
        """The toolchain parts that were test stand-ins when this was made (empty for real tools):
        the key's versions, or what the stage's probe found (a container's toolchain)."""
        from trtbuild.host.toolchain import standin_parts

        found = standin_parts(self.toolchain)
        probed = getattr(self.summary, "toolchain", None)  # an engine's: what its build probed
        return sorted(set(found) | set(standin_parts(probed.model_dump() if probed is not None else {})))


class RefEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="Artifact the ref pointed at from `time` on.")
    key: str = Field(description="Action key that artifact was recorded under.")
    time: UtcTime = Field(description="UTC time the ref was moved here (RFC 3339, `Z`).")


class Ref(BaseModel):
    """refs/<recipe>/<target>: a mutable name, with its append-only history. A ref only ever names an
    artifact that passed every validation its recipe asks of it."""

    model_config = ConfigDict(extra="forbid")
    schema_: int = Field(REF_SCHEMA, alias="schema", description="Version of this record's layout.")
    digest: str = Field(pattern=r"^[0-9a-f]{64}$", description="The artifact the name points at now.")
    key: str = Field(description="Action key of that artifact.")
    history: list[RefEntry] = Field(default_factory=list, description="Every artifact the ref pointed at, oldest first.")


class RecipeClaim(BaseModel):
    """refs/<recipe>/.recipe.json: which recipe owns the refs under a name, so two recipes that
    share a `name:` cannot move each other's refs."""

    model_config = ConfigDict(extra="forbid")
    schema_: int = Field(1, alias="schema", description="Version of this record's layout.")
    name: str = Field(description="The recipe's `name:`.")
    identity: str = Field(description="Where the recipe lives: its path inside its git work tree (the same on "
                                      "every CI checkout), else its absolute path; `embedded:` for the default.")


def dump(model: BaseModel) -> dict:
    return model.model_dump(mode="json", by_alias=True)


def first_error(exc) -> str:
    """A pydantic ValidationError's first problem, as `loc: msg`."""
    error = exc.errors()[0]
    # A key with a line break (a tampered file) is quoted, so the problem stays one line.
    where = ".".join(str(p) if str(p).isprintable() else repr(p) for p in error["loc"])
    return f"{where or 'record'}: {' '.join(error['msg'].split())}"


def parse_record(key: str, data: bytes, where: str) -> Optional[ActionRecord]:
    """A stored action record's bytes, checked: None for a record of the unversioned layout (it is
    rebuilt and replaced); CorruptStore naming `where` for one that does not parse or names another key."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past Python's stack
        raise CorruptStore(f"action record {where} is not valid JSON; run `trtbuild cache verify --repair`") from None
    if isinstance(raw, dict) and raw.get("schema") is None:
        return None  # written before records were versioned
    try:
        record = ActionRecord.model_validate(raw, strict=True)  # a tampered "1" or true is not coerced
    except ValidationError as exc:
        raise CorruptStore(f"action record {where} is malformed ({first_error(exc)}); "
                           "run `trtbuild cache verify --repair`") from None
    if record.key != key:
        raise CorruptStore(f"action record {where} names another key ({record.key})")
    return record
