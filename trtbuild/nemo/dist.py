"""Read mcore dist checkpoints (torch_dist and zarr) without megatron-core, one layer at a time."""

from __future__ import annotations

import gzip
import json
import math
import pickle
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trtbuild.errors import InvalidInput
from trtbuild.nemo.tensors import TensorSource, skipped, unstack


def open_dist(folder: Path) -> TensorSource:
    """Pick the backend from metadata.json (nemo.md section 1: `sharded_backend` torch_dist or zarr)."""
    meta_path = folder / "metadata.json"
    backend = None
    if meta_path.is_file():
        try:
            backend = json.loads(meta_path.read_text(encoding="utf-8")).get("sharded_backend")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise InvalidInput(f"{meta_path}: unreadable dist-checkpoint metadata ({e})") from None
    elif (folder / ".metadata").is_file():
        backend = "torch_dist"
    if backend == "torch_dist":
        return TorchDistSource(folder)
    if backend == "zarr":
        return ZarrSource(folder)
    raise InvalidInput(f"{meta_path}: unsupported sharded_backend {backend!r} (expected torch_dist or zarr)")


# --- torch_dist -------------------------------------------------------------------------------

# What a DCP `.metadata` pickle may name (seen in nemo-toolkit 2.4.1 checkpoints). Anything else
# is refused, so a crafted .metadata cannot run code while we read it.
_DCP_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata",
        "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.planner": {"WriteItem", "WriteItemType", "TensorWriteData", "LoadItemType"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "dict", "list", "tuple"},
}


class _Placeholder:
    """Stands in for megatron.core classes in .metadata (MCoreSavePlan in all_local_plans): inert data."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _MetadataUnpickler(pickle.Unpickler):
    # nemo.md section 0: the pickle references megatron.core...MCoreSavePlan; map megatron.* to a placeholder.
    def find_class(self, module: str, name: str) -> Any:
        if module == "megatron" or module.startswith("megatron."):
            return _Placeholder
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in _DCP_ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


class _Into:
    """The planner half that FileSystemReader.read_data needs: where each read lands."""

    def __init__(self, dest: torch.Tensor) -> None:
        self.dest = dest
        self.filled = 0

    def resolve_tensor(self, req: Any) -> torch.Tensor:
        t = self.dest
        for dim, (off, length) in enumerate(zip(req.dest_offsets, req.lengths)):
            t = t.narrow(dim, off, length)
        return t

    def commit_tensor(self, req: Any, tensor: torch.Tensor) -> None:
        self.filled += tensor.numel()

    def load_bytes(self, req: Any, value: Any) -> None:
        raise AssertionError("byte entries are never requested")


class TorchDistSource(TensorSource):
    """torch.distributed.checkpoint files read with no process group (nemo.md section 0)."""

    kind = "torch_dist"

    def __init__(self, folder: Path) -> None:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.origin = str(folder)
        path = folder / ".metadata"
        try:
            with open(path, "rb") as f:
                self._md = _MetadataUnpickler(f).load()
        except FileNotFoundError:
            raise InvalidInput(f"{path}: missing (a torch_dist checkpoint needs it)") from None
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as e:
            raise InvalidInput(f"{path}: not a readable DCP metadata file ({e})") from None
        self._reader = FileSystemReader(str(folder))
        self._reader.set_up_storage_reader(self._md, True)
        tensors = {k: v for k, v in self._md.state_dict_metadata.items()
                   if isinstance(v, TensorStorageMetadata) and not skipped(k)}
        self._tensors = tensors
        self._names = unstack((k, tuple(v.size)) for k, v in tensors.items())
        self.details = {"backend": "torch_dist", "stored_keys": len(tensors)}

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        key, layer = self._names[name]
        size = tuple(self._tensors[key].size)
        return size if layer is None else size[1:]

    def dtype(self, name: str) -> torch.dtype:
        return self._tensors[self._names[name][0]].properties.dtype

    def get(self, name: str) -> torch.Tensor:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
        from torch.distributed.checkpoint.planner import LoadPlan
        from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

        key, layer = self._names[name]
        md = self._tensors[key]
        full = tuple(md.size)
        offsets = [0] * len(full)
        sizes = list(full)
        if layer is not None:  # read only this layer's region of the stacked global tensor
            offsets[0], sizes[0] = layer, 1
        dest = torch.empty(sizes, dtype=md.properties.dtype)
        region = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        items = create_read_items_for_chunk_list(key, md, [region])
        into = _Into(dest)
        self._reader.read_data(LoadPlan(items), into).wait()
        if into.filled != dest.numel():
            raise InvalidInput(f"{self.origin}: stored chunks of '{key}' do not cover the tensor")
        return dest[0] if layer is not None else dest


# --- zarr -------------------------------------------------------------------------------------

def _np_dtype(spec: Any, where: Path) -> tuple[np.dtype, torch.dtype | None]:
    """numpy dtype to read the bytes with, and the torch dtype to view them as (bf16 has no numpy type)."""
    if spec == "bfloat16":  # patched in by mcore (nemo.md section 4, strategies/zarr.py)
        return np.dtype("<u2"), torch.bfloat16
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise InvalidInput(f"{where}: unsupported zarr dtype {spec!r}") from None
    if dt.kind not in "fiub" or dt.itemsize > 8:
        raise InvalidInput(f"{where}: unsupported zarr dtype {spec!r}")
    return dt, None


def _to_torch(arr: np.ndarray, view: torch.dtype | None) -> torch.Tensor:
    if arr.dtype.byteorder == ">":  # torch only holds native (little-endian) data
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    t = torch.from_numpy(arr)
    return t.view(view) if view is not None else t


class _ZArray:
    def __init__(self, folder: Path) -> None:
        meta_path = folder / ".zarray"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidInput(f"{meta_path}: unreadable ({e})") from None
        if meta.get("zarr_format") != 2:
            raise InvalidInput(f"{meta_path}: zarr_format {meta.get('zarr_format')!r} (only 2 is supported)")
        if meta.get("order", "C") != "C":
            raise InvalidInput(f"{meta_path}: order {meta.get('order')!r} (only C order is supported)")
        if meta.get("filters"):
            raise InvalidInput(f"{meta_path}: zarr filters {meta['filters']!r} are not supported")
        comp = meta.get("compressor")
        if comp is not None and comp.get("id") not in ("zlib", "gzip"):
            raise InvalidInput(f"{meta_path}: zarr compressor {comp.get('id')!r} is not supported "
                               "(mcore writes uncompressed chunks; zlib/gzip are read too)")
        self.folder = folder
        self.shape = tuple(int(s) for s in meta["shape"])
        self.chunks = tuple(int(c) for c in meta["chunks"])
        self.np_dtype, self.view = _np_dtype(meta["dtype"], meta_path)
        self.torch_dtype = self.view or torch.from_numpy(np.zeros(0, self.np_dtype.newbyteorder("<"))).dtype
        self.compressor = comp and comp["id"]
        self.sep = meta.get("dimension_separator", ".") or "."
        self.fill = meta.get("fill_value")

    def _chunk(self, index: tuple[int, ...]) -> np.ndarray:
        name = self.sep.join(str(i) for i in index) if index else "0"
        path = self.folder / name
        if not path.is_file():
            if self.fill is None:
                raise InvalidInput(f"{path}: zarr chunk file missing")
            return np.full(self.chunks, self.fill, dtype=self.np_dtype)
        raw = path.read_bytes()
        if self.compressor == "zlib":
            raw = zlib.decompress(raw)
        elif self.compressor == "gzip":
            raw = gzip.decompress(raw)
        want = math.prod(self.chunks) * self.np_dtype.itemsize
        if len(raw) != want:  # zarr v2 stores edge chunks at full chunk size
            raise InvalidInput(f"{path}: {len(raw)} bytes, expected {want} for chunk {list(self.chunks)}")
        return np.frombuffer(raw, dtype=self.np_dtype).reshape(self.chunks)

    def read(self, start: list[int], stop: list[int]) -> torch.Tensor:
        """The region [start, stop) assembled from the chunks that overlap it."""
        out = np.empty([b - a for a, b in zip(start, stop)], dtype=self.np_dtype)
        ranges = [range(a // c, (b - 1) // c + 1) if b > a else range(0)
                  for a, b, c in zip(start, stop, self.chunks)]
        for index in np.ndindex(*[len(r) for r in ranges]) if ranges else [()]:
            cidx = tuple(r[i] for r, i in zip(ranges, index))
            chunk = self._chunk(cidx)
            src, dst = [], []
            for d, ci in enumerate(cidx):
                lo = max(start[d], ci * self.chunks[d])
                hi = min(stop[d], (ci + 1) * self.chunks[d])
                src.append(slice(lo - ci * self.chunks[d], hi - ci * self.chunks[d]))
                dst.append(slice(lo - start[d], hi - start[d]))
            out[tuple(dst)] = chunk[tuple(src)]
        return _to_torch(out, self.view)


class ZarrSource(TensorSource):
    """A zarr v2 dist checkpoint: one folder per key with `.zarray` + raw C-order chunk files."""

    kind = "zarr"

    def __init__(self, folder: Path) -> None:
        self.origin = str(folder)
        arrays: dict[str, _ZArray] = {}
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            # _extra_state folders hold shard_*.pt pickles and no .zarray: never opened.
            if skipped(sub.name) or not (sub / ".zarray").is_file():
                continue
            arrays[sub.name] = _ZArray(sub)
        self._arrays = arrays
        self._names = unstack((k, a.shape) for k, a in arrays.items())
        self.details = {"backend": "zarr", "stored_keys": len(arrays)}

    def names(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        key, layer = self._names[name]
        shape = self._arrays[key].shape
        return shape if layer is None else shape[1:]

    def dtype(self, name: str) -> torch.dtype:
        return self._arrays[self._names[name][0]].torch_dtype

    def get(self, name: str) -> torch.Tensor:
        key, layer = self._names[name]
        arr = self._arrays[key]
        start, stop = [0] * len(arr.shape), list(arr.shape)
        if layer is not None:
            start[0], stop[0] = layer, layer + 1
        t = arr.read(start, stop)
        return t[0] if layer is not None else t
