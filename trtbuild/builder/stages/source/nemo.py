"""`nemo:` sources: a `.nemo` archive, an extracted one, or a NeMo 2 checkpoint folder, local or on
S3, keyed by its bytes and converted (trtbuild.nemo) into a Hugging Face LLaMA-layout folder."""

from __future__ import annotations

from pathlib import Path

from trtbuild.errors import InvalidInput
from trtbuild.builder.stages.base import StageContext
from trtbuild.store.summaries import SourceSummary
from trtbuild.builder.stages.source import remote
from trtbuild.builder.stages.source.common import Resolved, SourceContext
from trtbuild.store.tree import Entry, Manifest, build_manifest


def resolve(ctx: SourceContext) -> Resolved:
    location = ctx.runtime.location
    if location.startswith("s3://"):
        return _resolve_s3(ctx, location)
    path = Path(location).expanduser()
    path = path if path.is_absolute() else Path(ctx.runtime.base_dir) / path
    if path.is_file():
        digest = ctx.state.sha256(path, ctx.progress)
        return Resolved("nemo", digest, {"files": {path.name: digest}}, runtime={"checkpoint": str(path)},
                        origin=f"sha256 of {path}")
    if path.is_dir():
        manifest, _ = build_manifest(path, ctx.state, progress=ctx.progress)
        return Resolved("nemo", manifest.digest, {"files": {e.path: e.sha256 for e in manifest.entries}},
                        runtime={"checkpoint": str(path)}, origin=f"hashed {path}")
    raise InvalidInput(f"source.nemo: {path}: no such file or folder")


def _resolve_s3(ctx: SourceContext, url: str) -> Resolved:
    url = url.rstrip("/")
    s3, bucket, prefix, objects = remote.listing(url, folder=not url.endswith(".nemo"))
    if url.endswith(".nemo"):
        objects = [o for o in objects if o.key == prefix]
        if not objects:
            raise InvalidInput(f"source.nemo: {url}: no such object")
        names = {objects[0].key.rsplit("/", 1)[-1]: objects[0]}
        checkpoint = remote.local_path(ctx.downloads, bucket, prefix)
    else:  # a NeMo 2 folder (context/ + weights/) under a prefix
        names = {o.key[len(prefix) + 1:]: o for o in objects if o.key.startswith(prefix + "/")}
        if not names:
            raise InvalidInput(f"source.nemo: {url}/ holds no objects")
        checkpoint = remote.local_path(ctx.downloads, bucket, prefix)
    files = {n: {"key": o.key, "size": o.size, "sha256": remote.object_sha256(s3, ctx.state, ctx.downloads, bucket, o)}
             for n, o in sorted(names.items())}
    digest = (next(iter(files.values()))["sha256"] if url.endswith(".nemo")
              else Manifest.from_entries(Entry(n, f["size"], f["sha256"]) for n, f in files.items()).digest)
    return Resolved("nemo", digest, {"files": {n: f["sha256"] for n, f in files.items()}},
                    runtime={"checkpoint": str(checkpoint), "bucket": bucket, "objects": files},
                    origin=f"object checksums of {url}")


def convert_nemo(ctx: StageContext) -> None:
    """Runs in a worker process: fetch (when on S3), then convert to a Hugging Face folder."""
    from trtbuild.nemo import convert

    if ctx.runtime.objects:
        state = remote.state_for(ctx.runtime, ctx.state)
        remote.fetch_all(state, Path(ctx.runtime.downloads), ctx.runtime.bucket, ctx.runtime.objects)
    work = ctx.out.parent / "nemo-work"
    work.mkdir(exist_ok=True)
    report = convert(Path(ctx.runtime.checkpoint), ctx.out, work=work)
    ctx.tool_report(SourceSummary, report)
