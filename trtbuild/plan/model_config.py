"""The model config a plan reads, without the weights: source.config (an offline override), else
what the source carries: a local folder's or the Hub's config.json, a GGUF's header, an S3 model
folder's config.json object, a NeMo checkpoint's model config. Each reader returns the Hugging Face
config.json fields the source stage will write, and a line saying where they came from."""

from __future__ import annotations

import importlib.util
import json
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trtbuild.errors import InvalidInput
from trtbuild.model.config import ModelSpec, load_config, parse_config

if TYPE_CHECKING:
    from trtbuild.recipe.schema import LoadedRecipe


def find_model_config(loaded: LoadedRecipe, state=None) -> tuple[ModelSpec, str]:
    """The model shape planning reads, and where it came from: source.config (an offline override),
    else the source's own config (a local folder's or the Hub's config.json, a GGUF's header, an S3
    folder's config.json object, a NeMo checkpoint's model config). `state`: a store's stat cache,
    which keeps a GGUF header's config."""
    source = loaded.recipe.source
    if source.config is not None:
        path = loaded.resolve_path(source.config)
        if not path.is_file():
            raise InvalidInput(f"{loaded.where(('source', 'config'))}: source.config: {path}: no such file")
        return load_config(path), f"source.config {path}"
    if source.path is not None:
        path = loaded.resolve_path(source.path) / "config.json"
        if path.is_file():
            return load_config(path), str(path)
        raise InvalidInput(f"{loaded.where(('source', 'path'))}: source.path: {path}: no such file")
    if source.hf is not None:
        from trtbuild.model import hub

        revision = source.revision or "main"
        found = hub.config_json(source.hf, revision, loaded.where(("source", "hf")))
        if found is not None:
            return load_config(found), f"config.json of {source.hf}@{revision} ({found})"
        raise InvalidInput(
            f"{loaded.where(('source',))}: source: no local config.json for {source.describe()}; "
            "set source.config to a copy of the model's config.json"
        )
    if source.gguf is not None:
        config, origin = gguf_config(source.gguf, loaded.base_dir, state)
    elif source.s3 is not None and not source.s3.rstrip("/").endswith(".nemo"):
        config, origin = s3_config(source.s3)
    else:  # nemo:, or an s3: URL of a .nemo object (a NeMo source, as the graph reads it)
        config, origin = nemo_config(source.location, loaded.base_dir)
    return parse_config(config, origin), origin


def gguf_config(location: str, base_dir: Path, state=None) -> tuple[dict, str]:
    """`state` (a store's stat cache): the config is kept there under the file's sha256 and the
    header code's, once the source stage has hashed the file; later builds do not walk the header
    again (skipping SmolLM2's 49k-token vocabulary in Python is most of a plan's time)."""
    from trtbuild.model.files import locate_gguf

    path = locate_gguf(location, base_dir)
    origin = f"GGUF header of {path}"
    digest = state.known_sha256(path) if state is not None else None
    if digest is None:
        return _read_gguf_config(path), origin
    kind = f"gguf-config {state.sha256(_header_code())}"  # the code that derived it
    config = _kept_config(state.derived(kind, digest))
    if config is not None:
        return config, origin
    config = _read_gguf_config(path)
    state.put_derived(kind, digest, json.dumps(config))
    return config, origin


def _kept_config(kept: "str | None") -> "dict | None":
    """A config the stat cache kept, or None: index.db is a cache, and a row that is not a config
    object (damaged, or written by something else) is a miss, not an error."""
    try:
        config = json.loads(kept) if kept is not None else None
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


def _read_gguf_config(path: Path) -> dict:
    from trtbuild.model.gguf_header import hf_config, read_header

    return hf_config(read_header(path))


def _header_code() -> Path:
    """trtbuild/model/gguf_header.py, found without importing it: a config from the cache needs none of it."""
    return Path(importlib.util.find_spec("trtbuild.model.gguf_header").origin)


def s3_config(url: str) -> tuple[dict, str]:
    """One GET of `<prefix>/config.json`, with the S3 source's credentials and errors."""
    from trtbuild.store import s3_client as s3
    from trtbuild.model.config import parse_json_object

    url = url.rstrip("/") + "/config.json"
    return parse_json_object(s3.get_small_object(url), url), url


# A .nemo tar's config members are small; a member bigger than this is not one (a tar bomb guard).
_MEMBER_LIMIT = 64 << 20


def nemo_config(location: str, base_dir: Path) -> tuple[dict, str]:
    """The config inside the checkpoint: a folder's YAML, or the config members of a .nemo tar
    (locally, or on S3 through ranged GETs), never the weights."""
    if location.startswith("s3://"):
        return _nemo_s3_config(location.rstrip("/")), f"NeMo model config in {location}"
    path = Path(location).expanduser()
    path = path if path.is_absolute() else base_dir / path
    if path.is_dir():
        return _nemo_folder_config(path, str(path)), f"NeMo model config in {path}"
    if not path.is_file():
        raise InvalidInput(f"source.nemo: {path}: no such file or folder")
    with open(path, "rb") as archive:
        return _nemo_archive_config(archive, str(path)), f"NeMo model config in {path}"


def _nemo_s3_config(url: str) -> dict:
    from trtbuild.store import s3_client as s3

    if url.endswith(".nemo"):
        with s3.open_ranged(url) as archive:
            return _nemo_archive_config(archive, url)
    with tempfile.TemporaryDirectory(prefix="trtbuild-nemo-config-") as scratch:  # a NeMo 2 folder
        yaml_path = Path(scratch) / "context" / "model.yaml"
        yaml_path.parent.mkdir()
        yaml_path.write_bytes(s3.get_small_object(f"{url}/context/model.yaml"))
        return _nemo_folder_config(Path(scratch), url)


def _nemo_archive_config(archive, label: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="trtbuild-nemo-config-") as scratch:
        _extract_config_members(archive, label, Path(scratch))
        return _nemo_folder_config(Path(scratch), label)


def _nemo_folder_config(root: Path, label: str) -> dict:
    """The LlamaForCausalLM config.json the NeMo conversion writes, as far as the config tells:
    bias flags from the config (conversion looks at the tensors), vocab from the config or tokenizer."""
    from trtbuild.nemo.config import hf_config, read_nemo1, read_nemo2
    from trtbuild.nemo.tokenizer import export_tokenizer

    if (root / "context").is_dir():
        cfg = read_nemo2(root / "context" / "model.yaml", f"{label}: context/model.yaml")
    elif (root / "model_config.yaml").is_file():
        cfg = read_nemo1(root / "model_config.yaml", f"{label}: model_config.yaml")
    else:
        raise InvalidInput(f"source.nemo: {label}: not a NeMo checkpoint (no model_config.yaml, no context/)")
    vocab = cfg.vocab_size
    if vocab is None:
        with tempfile.TemporaryDirectory(prefix="trtbuild-nemo-tokenizer-") as out:
            vocab = export_tokenizer(cfg, root, Path(out)).vocab_size
    if vocab is None:
        raise InvalidInput(f"{cfg.source}: states no vocabulary size and its tokenizer tells none; "
                           "set source.config to a copy of the model's Hugging Face config.json")
    return hf_config(cfg, vocab_size=vocab, attention_bias=cfg.bias or cfg.qkv_bias, mlp_bias=cfg.bias)


def _extract_config_members(archive, label: str, dest: Path) -> None:
    """Copy a .nemo tar's config members into `dest`: model_config.yaml and the tokenizer files it
    names (NeMo 1), or context/ (a tarred NeMo 2 folder). The walk reads member headers and stops
    once they are found; NeMo writes its archives in sorted order, so that is before the weights."""
    import yaml

    from trtbuild.nemo.archive import _safe_name

    try:
        tar = tarfile.open(fileobj=archive, mode="r:")
    except tarfile.ReadError:  # gzipped, as NeMo wrote them before 2022: readable only from the start
        archive.seek(0)
        try:
            tar = tarfile.open(fileobj=archive, mode="r:gz")
        except (tarfile.ReadError, OSError) as exc:
            raise InvalidInput(f"{label}: not a .nemo archive (neither a tar nor a gzipped tar): {exc}") from None
    try:
        with tar:
            members: dict[str, tarfile.TarInfo] = {}
            needed: set[str] | None = None  # the tokenizer members model_config.yaml names
            for member in tar:
                name = _safe_name(member.name)
                if not name or not member.isreg():
                    continue
                if name.startswith("weights/") and "context/model.yaml" in members:
                    break  # a tarred NeMo 2 folder: context/ sorts before weights/
                members[name] = member
                if name == "model_config.yaml":
                    config = yaml.safe_load(_read_member(tar, member, label)) or {}
                    tokenizer = config.get("tokenizer") if isinstance(config, dict) else None
                    refs = [v[5:] for v in (tokenizer or {}).values() if isinstance(v, str) and v.startswith("nemo:")]
                    needed = {_safe_name(r) for r in refs} - {None}
                if needed is not None and needed <= set(members):
                    break
            wanted = [n for n in members if n in (needed or set()) | {"model_config.yaml"} or n.startswith("context/")]
            for name in wanted:
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(_read_member(tar, members[name], label))
    except (tarfile.TarError, EOFError, OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"{label}: malformed .nemo archive ({type(exc).__name__}: {exc})") from None


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, label: str) -> bytes:
    if member.size > _MEMBER_LIMIT:
        raise InvalidInput(f"{label}: member '{member.name}' is {member.size} bytes, "
                           f"more than a config or tokenizer file ({_MEMBER_LIMIT} at most)")
    return tar.extractfile(member).read()
