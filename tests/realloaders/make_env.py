"""Build the real-loader environment the tests judge checkpoints in (tests/test_vllm_real_loader.py):
a virtual environment at .realloaders/vllm-0.33.0 (git-ignored) with vLLM 0.33.0 and the packages
its argument parser, engine config and ModelOpt loader import (requirements.txt beside this file,
every one --no-deps), over this interpreter's own site-packages (a virtual environment's too) for
torch 2.13.0 (CPU): nothing
CUDA is downloaded, and torch is not installed twice.

Run by the README's test command before pytest. Built once: a second run with the same
requirements.txt and interpreter finds its stamp and does nothing. Built in a sibling folder and
renamed, so a half-built environment never stands at the path. Where it cannot be built, it prints
one line saying why and writes it to .realloaders/vllm-0.33.0.failed for the test to report; the
exit status is then 1 under CI (CI=true: the run must fail, not skip), 0 elsewhere (the test then
skips, saying why). Stdlib only."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REQUIREMENTS = HERE / "requirements.txt"
ENV = ROOT / ".realloaders" / "vllm-0.33.0"
FAILED = ENV.with_name(ENV.name + ".failed")
STAMP = "trtbuild-realloaders.json"
TORCH = "2.13.0"
# What the judge imports first: a smoke test that the environment is whole.
SMOKE = ("import torch, vllm.engine.arg_utils, vllm.model_executor.layers.quantization.modelopt, "
         "vllm.model_executor.model_loader; "
         f"assert torch.__version__.split('+')[0] == {TORCH!r}, torch.__version__; "
         "import transformers, sys; print(transformers.__version__, torch.__version__)")


def env_python(env: Path = ENV) -> Path:
    return env / "bin" / "python"


def wanted_stamp() -> dict:
    return {"requirements_sha256": hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest(),
            "python": sys.version.split()[0], "over": sys.prefix}


def up_to_date() -> bool:
    try:
        return json.loads((ENV / STAMP).read_text()) == wanted_stamp() and env_python().exists()
    except (OSError, ValueError):
        return False


def folder_bytes(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if not p.is_symlink() and p.is_file())


def over_this_interpreter(env: Path) -> None:
    """Make the environment see this interpreter's packages after its own, as --system-site-packages
    would for a base interpreter. venv's flag means the *base* interpreter's site-packages, so run
    from inside a virtual environment (torch installed there) it would leave torch out; a .pth line
    that adds this interpreter's site folders (their own .pth files included) does not."""
    import sysconfig

    ours = subprocess.run([str(env_python(env)), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    outer = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    lines = "".join(f"import site; site.addsitedir({folder!r})\n" for folder in outer)
    (Path(ours) / "zz-trtbuild-outer-site.pth").write_text(lines)  # zz: read after the environment's own


def build() -> None:
    tmp = ENV.with_name(f".{ENV.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True, text=True)
        over_this_interpreter(tmp)
        # this interpreter's pip installs into the environment (--python): no pip copied into it
        pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(env_python(tmp)), "install", "-q",
                              "--no-deps", "--no-warn-script-location", "-r", str(REQUIREMENTS)],
                             capture_output=True, text=True)
        if pip.returncode:
            last = [line for line in (pip.stderr or pip.stdout).splitlines() if line.strip()]
            raise RuntimeError(f"pip install -r {REQUIREMENTS.relative_to(ROOT)} failed: "
                               f"{last[-1] if last else 'exit ' + str(pip.returncode)}")
        smoke = subprocess.run([str(env_python(tmp)), "-c", SMOKE], capture_output=True, text=True,
                               env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
        if smoke.returncode:
            last = [line for line in smoke.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"the environment does not import vLLM's loaders: {last[-1] if last else ''}")
        (tmp / STAMP).write_text(json.dumps(wanted_stamp(), indent=1) + "\n")
        shutil.rmtree(ENV, ignore_errors=True)
        os.replace(tmp, ENV)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ENV.parent.mkdir(exist_ok=True)
    if up_to_date():
        FAILED.unlink(missing_ok=True)
        print(f"real-loader environment {ENV.relative_to(ROOT)}: up to date", file=sys.stderr)
        return 0
    start = time.monotonic()
    try:
        build()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        why = str(exc) if not isinstance(exc, subprocess.CalledProcessError) else (exc.stderr or str(exc)).strip()
        line = f"real-loader environment {ENV.relative_to(ROOT)} not built: {why}"
        FAILED.write_text(line + "\n")
        print(line, file=sys.stderr)
        return 1 if os.environ.get("CI") == "true" else 0
    FAILED.unlink(missing_ok=True)
    print(f"real-loader environment {ENV.relative_to(ROOT)}: built in {time.monotonic() - start:.0f} s, "
          f"{folder_bytes(ENV) / 2**20:.0f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
