"""TensorRT timing caches as artifacts. A timing cache records which kernel tactic won for each
layer shape on one GPU architecture and TensorRT version; fed to `trtllm-build
--input_timing_cache`, it spares the build the timing runs. Its key is (SM, TensorRT version or
container image, the options that change the tactics considered); the ref
`refs/_timing-caches/<key>` points at the newest one and moves after each successful build.

It never enters an engine's key. An engine key names an equivalence class (shared/design.md
section 4): TensorRT picks tactics by timing, so two builds with the same inputs may already differ
in their bytes; a timing cache changes which member of the class a build produces, not what it
computes, and the first engine stored under a key stays the one everybody gets."""

from __future__ import annotations

from typing import Any, Optional

from trtbuild import keys

REFS = "_timing-caches"  # a ref namespace no recipe can take (recipe names start with [a-z0-9])
VERSION = 1


def cache_key(sm: str, toolchain: dict[str, Optional[str]], tactic_options: dict[str, Any]) -> str:
    """The timing cache's key: the SM, TensorRT's version (the image digest when the build runs in a
    container), and the options that change which tactics are timed."""
    tensorrt = {"image": toolchain["image"]} if toolchain.get("image") else {"tensorrt": toolchain.get("tensorrt")}
    return keys.action_key({"stage": "timing-cache", "stage_version": VERSION, "inputs": {}, "params": tactic_options,
                            "toolchain": tensorrt, "platform": {"sm": sm}})
