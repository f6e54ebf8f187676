"""The unquantized Hugging Face checkpoint: the source's files with weights cast to the recipe's
dtype, streamed tensor by tensor (never the whole model in memory)."""

from __future__ import annotations

import json
from pathlib import Path

from trtbuild.checkpoint.safetensors_files import weight_files
from trtbuild.model.config import read_json_object
from trtbuild.model.files import copy_companion_files

INDEX = "model.safetensors.index.json"


def cast_checkpoint(source: Path, out: Path, dtype: str) -> dict:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    target = getattr(torch, dtype)
    shards = [source / name for name in weight_files(source)]  # the index's shards, not stray copies
    total_bytes, tensors, weight_map = 0, 0, {}
    for shard in shards:
        converted = {}
        with safe_open(shard, "pt") as f:
            metadata = f.metadata() or {}
            for name in f.keys():
                tensor = f.get_tensor(name)
                if tensor.is_floating_point():
                    tensor = tensor.to(target)
                converted[name] = tensor.contiguous()
                total_bytes += tensor.numel() * tensor.element_size()
                weight_map[name] = shard.name
        save_file(converted, out / shard.name, metadata={**metadata, "format": "pt"})
        tensors += len(converted)
        del converted  # one shard in memory at a time
    if (source / INDEX).exists():
        index = read_json_object(source / INDEX)
        index.setdefault("metadata", {})["total_size"] = total_bytes
        index["weight_map"] = weight_map
        (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    config = read_json_object(source / "config.json")
    config["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    copy_companion_files(source, out)  # tokenizer and generation config, as the source has them
    return {"tensors": tensors, "bytes": total_bytes, "dtype": dtype, "shards": len(shards)}
