"""The source stage: where the weights come from, keyed by content. One module per kind."""

from __future__ import annotations

from trtbuild.builder.stages.source.common import Resolved, SourceContext


def resolve(ctx: SourceContext) -> Resolved:
    """Identify the source's content (a digest) without copying or converting anything."""
    kind = ctx.runtime.kind
    if kind == "path":
        from trtbuild.builder.stages.source import local as module
    elif kind == "gguf":
        from trtbuild.builder.stages.source import gguf as module
    elif kind == "hf":
        from trtbuild.builder.stages.source import hf as module
    elif kind == "s3":
        from trtbuild.builder.stages.source import s3 as module
    elif kind == "nemo":
        from trtbuild.builder.stages.source import nemo as module
    else:
        raise ValueError(f"unknown source kind {kind!r}")
    return module.resolve(ctx)


__all__ = ["Resolved", "SourceContext", "resolve"]
