"""`pull --target auto`: the choice each rule implies, for hand-made lock files and recorded hosts
(NVML answering as a recorded H100, L40S or A100, or no driver; package metadata for tensorrt_llm,
tensorrt and vllm)."""

from __future__ import annotations

import pytest

from trtbuild.lock.lockfile import LockedPlatform, LockedRecipe, LockedTarget, LockFile
from trtbuild.deploy.select import Host, build_hint, choose, no_fit_lines, package_words
from trtbuild.host.toolchain import package_version

GIB = 1024 ** 3
TRTLLM, TRT = "1.2.1", "10.13.2"
# this host's llama-cpp-python, as Host.describe ends (probed like the other packages; these tests do not fake it)
LLAMACPP = package_words("llama_cpp_python", package_version("llama_cpp"))

if package_version("vllm") is not None or package_version("sglang") is not None:  # found where the tests assume none
    pytest.skip("assumes a host without vllm and sglang", allow_module_level=True)


def digest(n: int) -> str:
    return f"{n:064x}"


def engine(n: int, sm: str, tp: int = 1, per_rank: int = 1 * GIB, standin: bool = False,
           trtllm: str = TRTLLM, trt: str = TRT) -> LockedTarget:
    return LockedTarget(stage="engine", key=digest(n), digest=digest(1000 + n), size=per_rank * tp,
                        platform=LockedPlatform(sm=sm, tp=tp, pp=1, world_size=tp, tensorrt_llm=trtllm, tensorrt=trt,
                                                engine_bytes_per_rank=per_rank, standin=standin))


def hf(n: int, size: int = 2 * GIB) -> LockedTarget:
    return LockedTarget(stage="hf-checkpoint", key=digest(n), digest=digest(1000 + n), size=size)


def lock_of(targets: dict[str, LockedTarget]) -> LockFile:
    """A lock of validated targets (each with a validation that passed: nothing held back from publishing)."""
    checks = {f"{tid}:validate": LockedTarget(stage="validate", key=t.key, digest=t.digest, size=1, gates_passed=True)
              for tid, t in targets.items()}
    return LockFile(recipe=LockedRecipe(name="tiny", digest=digest(0)), source=None, toolchain={},
                    targets={**targets, **checks}, validation="run")


FORMATS = {"base-hf": (None, None), "fp8-hf": ("fp8", None), "awq-hf": ("int4_awq", None), "big-hf": (None, None)}


def formats(target_id, _entry):
    return FORMATS.get(target_id)


def matrix() -> LockFile:
    """The lock of a recipe with variants base, fp8, awq: engines for sm80/sm89/sm90 (tp1, and tp2
    on sm90), a stand-in engine, and hf-checkpoints; its order is the recipe's."""
    return lock_of({
        "source": LockedTarget(stage="source", key=digest(1), digest=digest(2), size=10),
        "base-tp1": LockedTarget(stage="checkpoint", key=digest(3), digest=digest(4), size=10),
        "base-tp1:validate": LockedTarget(stage="validate", key=digest(5), digest=digest(6), size=10, gates_passed=True),
        "base-tp1-sm80": engine(10, "sm80"),
        "base-tp1-sm89": engine(11, "sm89"),
        "base-tp1-sm90": engine(12, "sm90"),
        "base-tp2-sm90": engine(13, "sm90", tp=2),
        "fp8-tp1-sm90": engine(14, "sm90", standin=True, trtllm="1.2.0+standin", trt="10.14.1+standin"),
        "base-hf": hf(20),
        "fp8-hf": hf(21),
        "awq-hf": hf(22),
    })


VARIANTS = ["base", "fp8", "awq"]


@pytest.fixture
def host(recorded_gpu, installed_packages):
    def make(gpu, count=1, gpu_filter="auto", **packages):
        recorded_gpu(gpu, count)
        if packages:
            installed_packages(**packages)
        return Host.probe(gpu_filter)

    return make


def test_h100_throughput_takes_the_one_gpu_engine_and_latency_the_two_gpu_one(host):
    h = host("H100", count=2, tensorrt_llm=TRTLLM, tensorrt=TRT)
    assert choose(matrix(), h, prefer="throughput", formats=formats, variant_order=VARIANTS).chosen.target == "base-tp1-sm90"
    assert choose(matrix(), h, prefer="latency", formats=formats, variant_order=VARIANTS).chosen.target == "base-tp2-sm90"


def test_one_h100_cannot_hold_the_tp2_engine_so_latency_also_takes_tp1(host):
    h = host("H100", count=1, tensorrt_llm=TRTLLM, tensorrt=TRT)
    selection = choose(matrix(), h, prefer="latency", formats=formats, variant_order=VARIANTS)
    assert selection.chosen.target == "base-tp1-sm90"
    tp2 = next(c for c in selection.candidates if c.target == "base-tp2-sm90")
    assert tp2.reasons == ["world size: the engine needs 2 GPUs (tp 2 x pp 1); this host has 1 sm90 GPU"]


def test_l40s_takes_the_sm89_engine(host):
    h = host("L40S", tensorrt_llm=TRTLLM, tensorrt=TRT)
    assert choose(matrix(), h, formats=formats, variant_order=VARIANTS).chosen.target == "base-tp1-sm89"


def test_a100_takes_the_sm80_engine_only_with_the_exact_tensorrt(host):
    h = host("A100", tensorrt_llm=TRTLLM, tensorrt="10.13.3")
    selection = choose(matrix(), h, formats=formats, variant_order=VARIANTS)
    assert selection.chosen is None
    sm80 = next(c for c in selection.candidates if c.target == "base-tp1-sm80")
    assert sm80.reasons == ["tensorrt: the engine was built with 10.13.2; this host has 10.13.3"]


def test_an_engine_comes_before_an_hf_checkpoint_of_the_same_variant(host):
    h = host("A100", tensorrt_llm=TRTLLM, tensorrt=TRT, vllm="0.33.0")
    selection = choose(matrix(), h, formats=formats, variant_order=VARIANTS)
    assert (selection.chosen.target, selection.chosen.runtime) == ("base-tp1-sm80", "trtllm-engine")


def test_vllm_serves_the_hf_checkpoint_when_asked_for_it(host):
    h = host("A100", tensorrt_llm=TRTLLM, tensorrt=TRT, vllm="0.33.0")
    selection = choose(matrix(), h, runtime="vllm", formats=formats, variant_order=VARIANTS)
    assert (selection.chosen.target, selection.chosen.runtime, selection.chosen.world_size) == ("base-hf", "vllm", 1)
    reasons = {c.target: c.reasons for c in selection.candidates}
    assert reasons["awq-hf"] == ["vllm: does not serve int4_awq on sm80"]  # --runtime vllm: vllm's reason only
    assert reasons["fp8-hf"] == []
    assert reasons["base-tp1-sm80"] == ["runtime: --runtime vllm does not load TensorRT engines"]


def test_the_recipes_variant_order_decides_between_equals(host):
    h = host("A100", vllm="0.33.0")
    assert choose(matrix(), h, formats=formats, variant_order=["fp8", "base", "awq"]).chosen.target == "fp8-hf"
    assert choose(matrix(), h, formats=formats, variant_order=VARIANTS).chosen.target == "base-hf"


def test_tensorrt_llm_before_1_3_serves_no_hf_checkpoint_and_1_3_serves_awq_on_sm89(host):
    lock = lock_of({"awq-hf": hf(22)})
    old = choose(lock, host("L40S", tensorrt_llm="1.2.1"), formats=formats)
    assert old.chosen is None
    assert old.candidates[0].reasons == [
        "trtllm: 1.2.1 is installed; its PyTorch backend serves hf-checkpoints from 1.3 on",
        "vllm: not installed", "sglang: not installed"]


def test_tensorrt_llm_1_3_serves_awq_on_sm89(host):
    lock = lock_of({"awq-hf": hf(22)})
    chosen = choose(lock, host("L40S", tensorrt_llm="1.3.0"), formats=formats).chosen
    assert (chosen.target, chosen.runtime) == ("awq-hf", "trtllm")


def test_an_hf_checkpoint_larger_than_one_gpu_needs_several(host):
    lock = lock_of({"big-hf": hf(23, size=100 * GIB)})
    one = choose(lock, host("L40S", vllm="0.33.0"), formats=formats)
    assert one.candidates[0].reasons == ["trtllm: not installed",
                                        "memory: the checkpoint is 100.0 GiB; this host's 1 GPU holds 45.0 GiB each",
                                        "sglang: not installed"]
    three = choose(lock, host("L40S", count=3, gpu_filter="auto"), formats=formats)
    assert (three.chosen.target, three.chosen.world_size) == ("big-hf", 3)


def test_a_stand_in_engine_is_never_chosen(host):
    lock = lock_of({"fp8-tp1-sm90": engine(14, "sm90", standin=True, trtllm=TRTLLM, trt=TRT)})
    selection = choose(lock, host("H100", tensorrt_llm=TRTLLM, tensorrt=TRT), formats=formats)
    assert selection.chosen is None
    assert selection.candidates[0].reasons == [
        "stand-in: made by a stand-in toolchain (tensorrt_llm 1.2.1), not by TensorRT: it is not an engine anything can load"]


def test_gpu_sm_counts_only_this_hosts_gpus_of_that_sm(host):
    h = host("H100", gpu_filter="sm80", tensorrt_llm=TRTLLM, tensorrt=TRT)
    selection = choose(matrix(), h, formats=formats, variant_order=VARIANTS)
    assert selection.chosen is None
    assert h.describe() == f"no sm80 GPU, tensorrt_llm 1.2.1, tensorrt 10.13.2, no vllm, no sglang, {LLAMACPP}"
    assert build_hint("x.yaml", matrix(), h) == ("to make one: run `trtbuild build x.yaml --gpu auto` on a host with "
                                                "an sm80 GPU and tensorrt_llm")


def test_no_gpu_lists_every_target_with_why_and_the_build_that_would_make_one(host):
    h = host(None, tensorrt_llm=TRTLLM, tensorrt=TRT)
    lock = matrix()
    selection = choose(lock, h, formats=formats, variant_order=VARIANTS)
    assert selection.chosen is None
    no_gpu = "this host has no NVIDIA GPU (NVML sees none)"
    assert no_fit_lines(selection, h, "recipes/tiny.lock", build_hint("recipes/tiny.yaml", lock, h)) == [
        f"no target of recipes/tiny.lock fits this host (no NVIDIA GPU, tensorrt_llm 1.2.1, tensorrt 10.13.2, no vllm, no sglang, {LLAMACPP}):",
        "  base-tp1: a TensorRT-LLM checkpoint: no runtime serves it as it is (the engines built from it do)",
        f"  base-tp1-sm80: sm: the engine is for sm80; {no_gpu}",
        f"  base-tp1-sm89: sm: the engine is for sm89; {no_gpu}",
        f"  base-tp1-sm90: sm: the engine is for sm90; {no_gpu}",
        f"  base-tp2-sm90: sm: the engine is for sm90; {no_gpu}",
        "  fp8-tp1-sm90: stand-in: made by a stand-in toolchain (tensorrt_llm 1.2.0+standin), not by TensorRT: it is "
        "not an engine anything can load; sm: the engine is for sm90; this host has no NVIDIA GPU (NVML sees none); "
        "tensorrt_llm: the engine was built with 1.2.0+standin; this host has 1.2.1; "
        "tensorrt: the engine was built with 10.14.1+standin; this host has 10.13.2",
        f"  base-hf: gpu: {no_gpu}",
        f"  fp8-hf: gpu: {no_gpu}",
        f"  awq-hf: gpu: {no_gpu}",
        "to make one: on a host with an NVIDIA GPU and tensorrt_llm, run `trtbuild build recipes/tiny.yaml --gpu auto` "
        "(engines are built on the GPU they run on)",
    ]


def test_a_gpu_host_without_an_engine_of_its_sm_is_told_to_add_it(host):
    lock = lock_of({"base-tp1-sm80": engine(10, "sm80")})
    h = host("H100", tensorrt_llm=TRTLLM, tensorrt=TRT)
    selection = choose(lock, h, formats=formats)
    assert no_fit_lines(selection, h, "x.lock", build_hint("x.yaml", lock, h)) == [
        "no target of x.lock fits this host (1x NVIDIA H100 80GB HBM3 (sm90, 79.6 GiB), tensorrt_llm 1.2.1, "
        f"tensorrt 10.13.2, no vllm, no sglang, {LLAMACPP}):",
        "  base-tp1-sm80: sm: the engine is for sm80; this host has sm90 (1x NVIDIA H100 80GB HBM3)",
        "to make one: add sm90 to the recipe's `gpus:`, then run `trtbuild build x.yaml --gpu auto` on this host",
    ]


@pytest.mark.skipif(not getattr(__import__("yaml"), "__with_libyaml__", False), reason="PyYAML without libyaml")
def test_a_lock_file_is_parsed_by_libyaml_not_the_pure_python_loader(tmp_path, monkeypatch):
    """`pull --target auto` reads the whole lock before it chooses: PyYAML's pure-Python loader
    took 0.47 s for benchmarks/s3_speed.py's lock of 200 targets on a busy 2-core host, libyaml 0.03 s."""
    import yaml

    from trtbuild.lock import lockfile

    path = tmp_path / "tiny.lock"
    lock = matrix()
    path.write_text(lockfile.HEADER + yaml.safe_dump(lock.model_dump(mode="json", by_alias=True)))

    def pure_python(*_args, **_kwargs):
        raise AssertionError("the pure-Python SafeLoader was used")

    monkeypatch.setattr(yaml.SafeLoader, "__init__", pure_python)
    assert lockfile.read(path) == lock


def test_sglang_serves_fp8_on_an_l40s_but_not_awq(host):
    """docs/runtimes.md (trtbuild/data/runtime-support.json): SGLang takes FP8 from compute capability 89 and no W4A16_AWQ."""
    h = host("L40S", sglang="0.5.23")
    selection = choose(matrix(), h, formats=formats, variant_order=["fp8", "base", "awq"])
    assert (selection.chosen.target, selection.chosen.runtime) == ("fp8-hf", "sglang")
    reasons = {c.target: c.reasons for c in selection.candidates}
    assert reasons["awq-hf"] == ["trtllm: not installed", "vllm: not installed", "sglang: does not serve int4_awq on sm89"]


def test_sglang_does_not_serve_fp8_on_an_a100_where_vllm_does_on_marlin(host):
    lock = lock_of({"fp8-hf": hf(21)})
    only_sglang = choose(lock, host("A100", sglang="0.5.23"), formats=formats)
    assert only_sglang.chosen is None
    assert only_sglang.candidates[0].reasons == ["trtllm: not installed", "vllm: not installed",
                                                 "sglang: does not serve fp8 on sm80"]


def test_tensorrt_llm_1_3_serves_fp8_on_sm89_but_not_on_sm80(host):
    lock = lock_of({"fp8-hf": hf(21)})
    assert choose(lock, host("L40S", tensorrt_llm="1.3.0"), formats=formats).chosen.runtime == "trtllm"
    a100 = choose(lock, host("A100"), formats=formats)  # the same packages
    assert a100.chosen is None
    assert a100.candidates[0].reasons == ["trtllm: does not serve fp8 on sm80", "vllm: not installed",
                                          "sglang: not installed"]


def test_the_builds_loader_check_in_the_lock_narrows_what_the_table_allows(host):
    """A lock entry's `serves` is the build's own loader check (serving/check.json): a runtime the
    table would use but whose loader rules rejected this checkpoint is not chosen, nor an SM it left out."""
    checked = hf(21)
    checked.serves = {"vllm": ["sm90"]}  # TensorRT-LLM's loader rejected it; vLLM serves it on sm90 only
    h100 = host("H100", tensorrt_llm="1.3.0", vllm="0.33.0")
    selection = choose(lock_of({"fp8-hf": checked}), h100, formats=formats)
    assert (selection.chosen.target, selection.chosen.runtime) == ("fp8-hf", "vllm")
    only_trtllm = choose(lock_of({"fp8-hf": checked}), h100, runtime="trtllm", formats=formats)
    assert only_trtllm.chosen is None
    assert only_trtllm.candidates[0].reasons == [
        "trtllm: its loader rules reject this checkpoint (the build's serving/check.json)"]
    elsewhere = hf(22)
    elsewhere.serves = {"vllm": ["sm100"]}
    none = choose(lock_of({"fp8-hf": elsewhere}), h100, runtime="vllm", formats=formats)
    assert none.chosen is None and none.candidates[0].reasons == ["vllm: does not serve fp8 on sm90"]


def test_choosing_from_a_lock_imports_neither_the_recipe_the_graph_the_store_nor_an_s3_client(
        tmp_path, recorded_gpu, installed_packages):
    """A deploy host's `pull --target auto --dry-run` reads one lock file: the recipe's models, the
    stage graph, the local store and botocore/boto3 are start-up it does not need (issue #12's
    0.5 s), so they are not imported at all, even with --store s3:// (an engine's fit is in the
    lock; an hf-checkpoint's format may need its record, which opens the store)."""
    import os
    import subprocess
    import sys

    import yaml

    from trtbuild.lock import lockfile

    recorded_gpu("H100")
    site = installed_packages(tensorrt_llm=TRTLLM, tensorrt=TRT)
    path = tmp_path / "tiny.lock"
    engines_only = lock_of({n: t for n, t in matrix().targets.items() if t.stage != "hf-checkpoint"})
    path.write_text(lockfile.HEADER + yaml.safe_dump(engines_only.model_dump(mode="json", by_alias=True)))
    script = f"""
import sys
from trtbuild.cli import cli
try:
    cli(['pull', {str(path)!r}, '--store', 's3://nowhere/prefix', '--dry-run'], standalone_mode=False)
except SystemExit:
    pass
heavy = ('trtbuild.recipe.schema', 'trtbuild.builder.graph', 'trtbuild.plan.expand', 'trtbuild.store.local', 'trtbuild.store.s3',
         'boto3', 'botocore', 'filelock')
print('IMPORTED', sorted(m for m in heavy if m in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ["PYTHONPATH"]]),
           "TRTBUILD_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.splitlines() == [f"would pull base-tp1-sm90 (trtllm-engine, 1 GPU): artifact {digest(1012)}",
                                          "IMPORTED []"]
    assert not (tmp_path / "cache").exists()  # a dry run makes no local store either
