"""Convert a NeMo GPT/Llama checkpoint into a Hugging Face LLaMA folder: the one entry point."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from trtbuild.errors import InvalidInput
from trtbuild.nemo.archive import Limits, open_source
from trtbuild.nemo.ckpt import CkptSource, find_shards
from trtbuild.nemo.config import NemoConfig, hf_config, read_nemo1, read_nemo2
from trtbuild.nemo.dist import open_dist
from trtbuild.nemo.mapping import build_plan, check_supported
from trtbuild.nemo.tensors import TensorSource
from trtbuild.nemo.tokenizer import export_tokenizer
from trtbuild.nemo.writer import write_safetensors


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _rmtree(path: Path) -> None:
    def retry(func, p, _exc):  # a read-only folder from the archive: make it writable, try again
        os.chmod(os.path.dirname(p), 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
        func(p)
    if path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=retry)
        else:
            shutil.rmtree(path, onerror=retry)


def _open_weights(root: Path, cfg: NemoConfig, nemo2: bool) -> TensorSource:
    if nemo2:
        # nemo.md section 3: weights/ holds the dist-ckpt; early 2.0 checkpoints had it at the top level.
        weights = root / "weights" if (root / "weights").is_dir() else root
        if not ((weights / "metadata.json").is_file() or (weights / ".metadata").is_file()):
            raise InvalidInput(f"{root}: NeMo 2 checkpoint without weights/ (no dist-checkpoint metadata)")
        return open_dist(weights)
    if (root / "model_weights").is_dir():  # dist-ckpt: ckpt_to_dir("model_weights.ckpt") (nemo.md §1)
        return open_dist(root / "model_weights")
    shards = find_shards(root)
    if shards is None:
        raise InvalidInput(f"{root}: no weights (model_weights/, model_weights.ckpt, mp_rank_XX/ or "
                           "tp_rank_XX_pp_rank_YYY/)")
    if cfg.vp and cfg.vp > 1:
        raise InvalidInput(f"{cfg.source}: virtual_pipeline_model_parallel_size {cfg.vp} with non-dist "
                           "weights is not supported")
    # fc1 holds per-rank [gate_r; up_r] halves: always for mcore linear_fc1, for legacy only with fast-*.
    def glu_pair(name: str) -> bool:
        return cfg.gated and ("linear_fc1." in name or cfg.activation.startswith("fast-"))
    return CkptSource(root, shards, glu_pair)


def convert(source: Path, out: Path, work: Path | None = None, *, limits: Limits | None = None) -> dict:
    """Convert `source` (.nemo file, extracted .nemo folder or NeMo 2 folder) into `out`.

    Scratch space (a .nemo tar is extracted there) is a new temporary folder under `work`, or
    beside `out` when `work` is None, removed at the end. Returns a report of what was found.
    """
    source, out = Path(source), Path(out)
    base = Path(work) if work is not None else out.parent
    base.mkdir(parents=True, exist_ok=True)
    # A fresh folder of our own: never mixes with, or deletes, anything already under `work`.
    scratch = Path(tempfile.mkdtemp(prefix=".nemo-work-", dir=base))
    stage = scratch / "tokenizer"
    src: TensorSource | None = None
    opened_root: Path | None = None
    try:
        opened = open_source(source, scratch, limits)
        root = opened_root = opened.root
        nemo2 = opened.form == "nemo2-dir"
        cfg = (read_nemo2(root / "context" / "model.yaml", f"{source.name}/context/model.yaml") if nemo2
               else read_nemo1(root / "model_config.yaml", f"{source.name}/model_config.yaml"))
        check_supported(cfg)
        src = _open_weights(root, cfg, nemo2)

        # Tokenizer files go to a staging folder first: nothing lands in `out` until the weights check out.
        stage.mkdir()
        tok = export_tokenizer(cfg, root, stage)
        vocab = cfg.vocab_size or tok.vocab_size
        plan = build_plan(cfg, src, vocab)

        gen_src = root / "context" / "artifacts" / "generation_config.json"
        generation = None
        if nemo2 and gen_src.is_file() and not gen_src.is_symlink():
            try:
                generation = json.loads(gen_src.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise InvalidInput(f"{gen_src}: not valid JSON ({e})") from None
        bos = (generation or {}).get("bos_token_id", tok.bos_token_id)
        eos = (generation or {}).get("eos_token_id", tok.eos_token_id)
        config = hf_config(cfg, vocab_size=plan.vocab_size, attention_bias=plan.attention_bias,
                           mlp_bias=plan.mlp_bias, bos_token_id=bos, eos_token_id=eos)

        out.mkdir(parents=True, exist_ok=True)
        nbytes = write_safetensors(out / "model.safetensors", plan.outputs)
        files = ["model.safetensors"]
        _write_json(out / "config.json", config)
        files.append("config.json")
        if generation is not None:
            shutil.copyfile(gen_src, out / "generation_config.json")  # verbatim, as NeMo stored it
            files.append("generation_config.json")
        for name in tok.files:
            shutil.copyfile(stage / name, out / name)
        files += tok.files

        dtypes = sorted({str(o.dtype).replace("torch.", "") for o in plan.outputs})
        notes = list(tok.notes)
        if dtypes != [cfg.dtype]:
            notes.append(f"tensors kept as stored ({', '.join(dtypes)}); config torch_dtype {cfg.dtype} "
                         f"comes from the checkpoint's precision")
        if not vocab:
            notes.append("vocabulary size unknown from the tokenizer: embedding rows kept as they are")
        return {
            "source": str(source),
            "form": opened.form,
            "compressed": opened.compressed,
            "nemo_version": cfg.nemo_version,
            "weights": src.kind,
            "weights_details": dict(src.details),
            "key_style": plan.key_style,
            "key_prefix": plan.prefix,
            "tensors": len(plan.outputs),
            "parameters": sum(math.prod(o.shape) for o in plan.outputs),
            "bytes": nbytes,
            "dtype": dtypes[0] if len(dtypes) == 1 else dtypes,
            "config_dtype": cfg.dtype,
            "vocab_size": plan.vocab_size,
            "padded_vocab_size": plan.padded_vocab,
            "vocab_rows_trimmed": plan.padded_vocab - plan.vocab_size,
            "tied_embeddings": cfg.tied,
            "zero_centered_gamma": cfg.zero_centered_gamma,
            "tokenizer": {"kind": tok.kind, "files": list(tok.files)},
            "files": files,
            "notes": notes,
        }
    except InvalidInput as e:
        if opened_root is None or opened_root == source:
            raise
        # Name the user's .nemo file, not the scratch folder it was extracted into.
        raise InvalidInput(*[m.replace(str(opened_root), str(source)) for m in e.messages]) from None
    finally:
        if src is not None:
            src.close()
        _rmtree(scratch)  # the extracted tar can be as big as the model: never leave it behind
