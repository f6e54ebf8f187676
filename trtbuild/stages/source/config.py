"""The model config a source carries, read for planning without its weights: a GGUF's header, an
S3 model folder's config.json object, a NeMo checkpoint's model config. Each returns the Hugging
Face config.json fields the source stage will write, and a line saying where they came from."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from trtbuild.errors import InvalidInput


def gguf_config(location: str, base_dir: Path) -> tuple[dict, str]:
    from trtbuild.ggufheader import hf_config, read_header
    from trtbuild.stages.source.gguf import locate_gguf

    path = locate_gguf(location, base_dir)
    return hf_config(read_header(path)), f"GGUF header of {path}"


def s3_config(url: str) -> tuple[dict, str]:
    """One GET of `<prefix>/config.json`, with the S3 source's credentials and errors."""
    from trtbuild import s3
    from trtbuild.modelconfig import parse_json_object

    url = url.rstrip("/") + "/config.json"
    return parse_json_object(s3.get_small_object(url), url), url


# Members of a .nemo tar that hold its config (NeMo 1 at the top, NeMo 2 under context/); its
# tokenizer is read too when the config does not state the vocabulary size (NeMo 1).
_MEMBER_LIMIT = 64 << 20


def nemo_config(location: str, base_dir: Path) -> tuple[dict, str]:
    if location.startswith("s3://"):
        raise InvalidInput(f"source.nemo: {location}: reading the model config of a NeMo checkpoint on S3 is not "
                           "supported yet; set source.config to a copy of its Hugging Face config.json")
    path = Path(location).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if path.is_dir():
        return _nemo_folder_config(path, path), f"NeMo model config in {path}"
    if not path.is_file():
        raise InvalidInput(f"source.nemo: {path}: no such file or folder")
    with tempfile.TemporaryDirectory(prefix="trtbuild-nemo-config-") as scratch:
        _extract_config_members(path, Path(scratch))
        return _nemo_folder_config(Path(scratch), path), f"NeMo model config in {path}"


def _nemo_folder_config(root: Path, source: Path) -> dict:
    """The LlamaForCausalLM config.json the NeMo conversion writes, as far as the config tells:
    bias flags from the config (conversion looks at the tensors), vocab from the config or tokenizer."""
    from trtbuild.nemo.config import hf_config, read_nemo1, read_nemo2
    from trtbuild.nemo.tokenizer import export_tokenizer

    if (root / "context").is_dir():
        cfg = read_nemo2(root / "context" / "model.yaml", f"{source}: context/model.yaml")
    elif (root / "model_config.yaml").is_file():
        cfg = read_nemo1(root / "model_config.yaml", f"{source}: model_config.yaml")
    else:
        raise InvalidInput(f"source.nemo: {source}: not a NeMo checkpoint (no model_config.yaml, no context/)")
    vocab = cfg.vocab_size
    if vocab is None:
        with tempfile.TemporaryDirectory(prefix="trtbuild-nemo-tokenizer-") as out:
            vocab = export_tokenizer(cfg, root, Path(out)).vocab_size
    if vocab is None:
        raise InvalidInput(f"{cfg.source}: states no vocabulary size and its tokenizer tells none; "
                           "set source.config to a copy of the model's Hugging Face config.json")
    return hf_config(cfg, vocab_size=vocab, attention_bias=cfg.bias or cfg.qkv_bias, mlp_bias=cfg.bias)


def _extract_config_members(archive: Path, dest: Path) -> None:
    """Copy the config members (and a NeMo 1 tokenizer they name) out of a .nemo tar; weights stay."""
    import yaml

    from trtbuild.nemo.archive import _open_tar, _safe_name

    tar, _ = _open_tar(archive)
    try:
        with tar:
            members = {}
            for member in tar:  # headers only: an uncompressed tar is walked by seeking past the data
                name = _safe_name(member.name)
                if name and member.isreg():
                    members[name] = member
            wanted = [n for n in members if n == "model_config.yaml" or n.startswith("context/")]
            if "model_config.yaml" in members:
                tokenizer = yaml.safe_load(tar.extractfile(members["model_config.yaml"]).read() or b"{}")
                tokenizer = (tokenizer or {}).get("tokenizer") if isinstance(tokenizer, dict) else None
                for value in (tokenizer or {}).values():
                    if isinstance(value, str) and value.startswith("nemo:") and _safe_name(value[5:]) in members:
                        wanted.append(_safe_name(value[5:]))
            for name in wanted:
                member = members[name]
                if member.size > _MEMBER_LIMIT:
                    raise InvalidInput(f"{archive}: member '{member.name}' is {member.size} bytes, "
                                       f"more than a config or tokenizer file ({_MEMBER_LIMIT} at most)")
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    except (tarfile.TarError, EOFError, OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"{archive}: malformed .nemo archive ({type(exc).__name__}: {exc})") from None
