"""`s3:` sources: a Hugging Face-layout folder in a bucket, keyed by the tree digest of the files a
model needs, computed from object checksums (or one hashing download) without copying anything."""

from __future__ import annotations

from pathlib import Path

from trtbuild.errors import InvalidInput
from trtbuild.builder.stages.base import StageContext
from trtbuild.builder.stages.source import remote
from trtbuild.model.files import select_model_files
from trtbuild.builder.stages.source.common import Resolved, SourceContext
from trtbuild.store.tree import Entry, Manifest


def resolve(ctx: SourceContext) -> Resolved:
    url = ctx.runtime.location.rstrip("/")
    s3, bucket, prefix, objects = remote.listing(url + "/", folder=True)
    by_name = {o.key[len(prefix) + 1:]: o for o in objects if o.key.startswith(prefix + "/")}
    selected = sorted(select_model_files(by_name))
    if not objects:
        raise InvalidInput(f"source.s3: {url}/ holds no objects")
    if "config.json" not in selected:
        raise InvalidInput(f"source.s3: {url}/ has no config.json (is it a Hugging Face model folder?)")
    files = {}
    for name in selected:
        obj = by_name[name]
        files[name] = {"key": obj.key, "size": obj.size,
                       "sha256": remote.object_sha256(s3, ctx.state, ctx.downloads, bucket, obj)}
    # The digest is the tree digest the artifact will have: content only, like a local folder's.
    digest = Manifest.from_entries(Entry(n, f["size"], f["sha256"]) for n, f in files.items()).digest
    return Resolved("tree", digest, {"files": {n: f["sha256"] for n, f in files.items()}},
                    runtime={"bucket": bucket, "prefix": prefix, "objects": files},
                    origin=f"object checksums under {url}/ (or their hashes, remembered by ETag)")


def fetch_folder(ctx: StageContext) -> None:
    """Download what the cache lacks (in parallel), verify it, adopt the files as the artifact."""
    downloads = Path(ctx.runtime.downloads)
    bucket, prefix, objects = ctx.runtime.bucket, ctx.runtime.prefix, ctx.runtime.objects
    remote.fetch_all(ctx.state, downloads, bucket, objects)
    folder = remote.local_path(downloads, bucket, prefix)
    ctx.adopt(folder, objects.__contains__, link=True)
