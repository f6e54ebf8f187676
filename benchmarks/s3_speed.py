"""How fast trtbuild moves an artifact to and from S3, against awscli and raw boto3 on the same server.

    python benchmarks/s3_speed.py [--gib 2] [--files 8] [--repeat 3] [--json]

One run, one SeaweedFS (tests/s3server.py: `weed mini` on 127.0.0.1, credentials enforced), one
bucket; everything it writes (the server's data folder included) is removed at the end.

1. Writes an artifact of --files files totalling --gib GiB (random bytes, each file different) and
   ingests it into a fresh local store as a built checkpoint would be: its manifest and blobs, an
   action record, a passed validation beside it, and a lock file for a tiny recipe that names both.
   So the timed commands are the real CLI (`python -m trtbuild push` / `pull`), start-up included.
2. Times, median of --repeat:
   - `trtbuild push RECIPE --store s3://bench/trtbuild-N` into an empty prefix (cold);
   - the same push again (nothing changed: goal < 1 s);
   - `trtbuild pull LOCK --target base-tp1 --dest DIR` into a fresh local store (every blob
     hashed while it streams; the files in DIR are then checked against the SHA-256 computed
     when they were written, outside the timing);
   - `aws s3 cp --recursive` of the same files up (to an empty prefix) and down (to a fresh folder);
   - raw boto3: one transfer manager downloading the same blobs to files, all at once, with
     trtbuild's TransferConfig (ranges of S3Store.download_chunk, S3Store.concurrency at once; no
     verification, no fsync), in a fresh process like the others.
   Ratios: trtbuild/awscli throughput both ways (goal >= 1.0), pull time / raw boto3 time (goal
   <= 1.10).
3. Times `trtbuild pull LOCK --target auto --dry-run` (choose only) on a generated lock of 200
   targets, with NVML answering as one recorded H100 (tests/standin_nvml) and tensorrt_llm /
   tensorrt metadata installed, against `python -c pass`: goal < 0.5 s beyond interpreter start.

Exits 1 when a goal is missed. Every process reads and writes through the page cache (the files
were just written), so this compares the clients and the server, not the disk.

--smoke (tests/test_benchmarks.py): a 2 MiB artifact of 2 files, one run of everything, the goals
printed but not judged (a test never compares wall-clock figures; a transfer that fails or brings
back other bytes still exits 1), and the awscli rows left out where `aws` is not installed (the
test extras do not install it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from s3server import SeaweedS3  # noqa: E402
from trtbuild.lock import lockfile  # noqa: E402
from trtbuild.lock.lockfile import LockedPlatform, LockedRecipe, LockedTarget, LockFile  # noqa: E402
from trtbuild.recipe.schema import load_recipe  # noqa: E402
from trtbuild.store.records import ActionRecord, Digest, Execution  # noqa: E402
from trtbuild.store.local import LocalStore  # noqa: E402
from trtbuild.store.s3 import S3Store  # noqa: E402

BUCKET = "bench"
MB = 1e6
TRTLLM, TRT = "1.2.1", "10.13.2"  # the toolchain the generated lock's engines record, and the host "has"
TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
               "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 4096,
               "hidden_act": "silu", "rope_theta": 10000.0, "torch_dtype": "bfloat16"}
RECIPE = "schema: 1\nname: tiny\nsource:\n  path: model\n  config: config.json\ngpus: [sm90]\n"
WARM_IMPORTS = ("import boto3.s3.transfer, trtbuild.cli, trtbuild.lock.lockfile, trtbuild.deploy.push, trtbuild.builder.pipeline, "
                "trtbuild.deploy.select, trtbuild.store.s3, trtbuild.store.transfer, trtbuild.store.checkout")
# The raw baseline: boto3's transfer manager alone with trtbuild's TransferConfig (ranges of
# download_chunk, concurrency requests at once), every object submitted at once as pull does, each
# written as download_file writes it (a temp name, renamed), nothing verified and nothing fsynced.
RAW_DOWNLOAD = """
import sys, boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
bucket, chunk, concurrency, out, *pairs = sys.argv[1:]
config = TransferConfig(multipart_threshold=int(chunk), multipart_chunksize=int(chunk),
                        max_concurrency=int(concurrency))
with create_transfer_manager(boto3.client("s3"), config) as manager:
    futures = [manager.download(bucket, key, f"{out}/{name}") for key, name in zip(pairs[::2], pairs[1::2])]
    for future in futures:
        future.result()
"""


def timed(command: list[str], env: dict, before=None, after=None) -> float:
    """Seconds one run of `command` takes (it must succeed); `before`/`after` run untimed."""
    if before:
        before()
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    if after:
        after(result)
    return seconds


def median_of(repeat: int, run_once) -> tuple[float, list[float]]:
    times = [run_once(i) for i in range(repeat)]
    return statistics.median(times), times


def write_artifact(folder: Path, gib: float, files: int) -> dict[str, str]:
    """--files files of random bytes (each its own, so no two share a blob); returns name -> sha256."""
    folder.mkdir(parents=True)
    size, sums = int(gib * 1024**3 / files), {}
    for i in range(files):
        name = f"rank{i}-{i + 1:05d}-of-{files:05d}.safetensors"
        sha, left = hashlib.sha256(), size
        with open(folder / name, "wb") as f:
            while left > 0:
                block = os.urandom(min(left, 16 * 1024 * 1024))
                sha.update(block)
                f.write(block)
                left -= len(block)
        sums[name] = sha.hexdigest()
    return sums


def record_for(store: LocalStore, folder: Path, target: str, stage: str, n: int) -> ActionRecord:
    manifest = store.ingest(folder)
    record = ActionRecord(key=f"{n:064x}", artifact=Digest(hash=manifest.digest, size_bytes=manifest.size),
                          stage=stage, stage_version=1, target=target, recipe="tiny", created="2026-12-01T00:00:00Z",
                          toolchain={}, execution=Execution(seconds=0.0, host="bench"),
                          fields={"stage": stage, "stage_version": 1, "inputs": {}, "params": {}, "toolchain": {},
                                  "platform": {}})
    return store.put_record(record)


def write_lock(path: Path, recipe: Path, targets: dict[str, LockedTarget]) -> None:
    lock = LockFile(recipe=LockedRecipe(name="tiny", digest=lockfile.recipe_digest(load_recipe(recipe))),
                    source=None, toolchain={}, targets=targets, validation="run")
    path.write_text(lockfile.HEADER + yaml.safe_dump(lock.model_dump(mode="json", by_alias=True)))


def big_lock(path: Path, recipe: Path) -> str:
    """A lock of 200 targets: 10 variants x tp 1/2/4/8, each a checkpoint (with a passed validation)
    and engines for sm80, sm89, sm90 and sm100. Returns the target one H100 with TRTLLM/TRT must choose."""
    variants = ["base", "base-fp8kv", "fp8", "fp8-fp8kv", "int8-sq", "int4-awq", "w4a8-awq", "int8-wo", "int4-wo",
                "nvfp4-fp8kv"]
    targets, n = {}, 0
    for variant in variants:
        for tp in (1, 2, 4, 8):
            n += 1
            targets[f"{variant}-tp{tp}"] = LockedTarget(stage="checkpoint", key=f"{n:064x}", digest=f"{n + 10**6:064x}",
                                                        size=tp << 30)
            # its validation passed: what publishes the checkpoint and its engines (trtbuild.lock.publication)
            targets[f"{variant}-tp{tp}:validate"] = LockedTarget(stage="validate", key=f"{n + 2 * 10**6:064x}",
                                                                 digest=f"{n + 3 * 10**6:064x}", size=1024,
                                                                 gates_passed=True)
            for sm in ("sm80", "sm89", "sm90", "sm100"):
                n += 1
                targets[f"{variant}-tp{tp}-{sm}"] = LockedTarget(
                    stage="engine", key=f"{n:064x}", digest=f"{n + 10**6:064x}", size=tp << 30,
                    platform=LockedPlatform(sm=sm, tp=tp, pp=1, world_size=tp, tensorrt_llm=TRTLLM, tensorrt=TRT,
                                            engine_bytes_per_rank=1 << 30, standin=False))
    assert len([t for t in targets if ":" not in t]) == 200
    write_lock(path, recipe, targets)
    # one GPU (throughput), then without the recipe the lock's order: its names sorted, as it is written
    return min(f"{variant}-tp1-sm90" for variant in variants)


def empty_prefix(client, prefix: str) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0, help="artifact size in GiB (default 2)")
    parser.add_argument("--files", type=int, default=8, help="files in the artifact (default 8)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each transfer; the median is shown (default 3)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--smoke", action="store_true",
                        help="2 MiB in 2 files, one run each, goals not judged (the test suite)")
    args = parser.parse_args()
    if args.smoke:
        args.gib, args.files, args.repeat = 2 / 1024, 2, 1
    if shutil.which("aws"):
        awscli = subprocess.run(["aws", "--version"], capture_output=True, text=True)
        aws_version = (awscli.stdout or awscli.stderr).strip()
    elif args.smoke:
        aws_version = None  # its rows are left out
    else:
        parser.error("the awscli baseline needs `aws` on PATH (python3 -m pip install awscli)")
    defaults = S3Store("s3://x").transport  # its part_size, concurrency and download_chunk
    figures: dict = {"gib": args.gib, "files": args.files, "repeat": args.repeat, "cores": os.cpu_count(),
                     "python": sys.version.split()[0], "awscli": aws_version,
                     "smoke": args.smoke, "load_average_start": [round(x, 2) for x in os.getloadavg()],
                     "trtbuild_s3": {"part_size": defaults.part_size, "concurrency": defaults.concurrency,
                                     "download_chunk": defaults.download_chunk},
                     "how": "the real CLI: python -m trtbuild push RECIPE / pull LOCK --target base-tp1 --dest DIR "
                            "(a tiny recipe and a lock naming an artifact ingested through the store API)"}

    with tempfile.TemporaryDirectory(prefix="trtbuild-bench-s3-") as tmp_name, SeaweedS3() as server:
        tmp = Path(tmp_name)
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        (tmp / "tmpdir").mkdir()  # S3Store's local areas ($TMPDIR/trtbuild-s3) go away with the rest
        # Byte code cached as an installed package has it (PYTHONDONTWRITEBYTECODE would compile every
        # module in every process), in a folder of this run's instead of the repository's __pycache__.
        base_env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **server.env(),
                    "AWS_EC2_METADATA_DISABLED": "true", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp / "tmpdir"),
                    "PYTHONPYCACHEPREFIX": str(tmp / "pycache"),
                    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        trtbuild = [sys.executable, "-m", "trtbuild"]

        # ---- the artifact, as a build leaves it ------------------------------------------------------
        project = tmp / "project"
        project.mkdir()
        (project / "config.json").write_text(json.dumps(TINY_CONFIG))
        recipe = project / "recipe.yaml"
        recipe.write_text(RECIPE)
        local = LocalStore(tmp / "local")
        local.create()
        art = tmp / "artifact"
        sums = write_artifact(art, args.gib, args.files)
        total = sum((art / name).stat().st_size for name in sums)
        checkpoint = record_for(local, art, "base-tp1", "checkpoint", 1)
        report = tmp / "validation"
        report.mkdir()
        (report / "report.json").write_text('{"gates_passed": true}\n')
        validation = record_for(local, report, "base-tp1:validate", "validate", 2)
        write_lock(recipe.with_suffix(".lock"), recipe, {
            "base-tp1": LockedTarget(stage="checkpoint", key=checkpoint.key, digest=checkpoint.digest,
                                     size=checkpoint.size),
            "base-tp1:validate": LockedTarget(stage="validate", key=validation.key, digest=validation.digest,
                                              size=validation.size, gates_passed=True)})
        env = {**base_env, "TRTBUILD_CACHE": str(local.root)}
        figures["bytes"] = total
        # warm-up, untimed: every process below then finds its modules compiled
        timed([sys.executable, "-c", WARM_IMPORTS], env)
        if aws_version:
            timed(["aws", "s3", "ls", f"s3://{BUCKET}"], base_env)

        # ---- push ------------------------------------------------------------------------------------
        def push_cold(i: int) -> float:
            return timed([*trtbuild, "push", str(recipe), "--store", f"s3://{BUCKET}/trtbuild-{i}"], env)

        def push_again(i: int) -> float:
            def moved_nothing(result) -> None:
                if not result.stdout.splitlines()[-1].startswith("0 blobs (0 B) sent"):
                    raise SystemExit(f"a re-push moved bytes: {result.stdout}")
            return timed([*trtbuild, "push", str(recipe), "--store", f"s3://{BUCKET}/trtbuild-0"], env,
                         after=moved_nothing)

        t_push, push_runs = median_of(args.repeat, push_cold)
        t_repush, repush_runs = median_of(args.repeat, push_again)
        for i in range(1, args.repeat):  # only trtbuild-0 is read from now on
            empty_prefix(client, f"trtbuild-{i}/")

        # ---- pull ------------------------------------------------------------------------------------
        def pull_once(i: int) -> float:
            deploy, dest = tmp / "deploy-store", tmp / "serve" / "model"

            def fresh() -> None:
                shutil.rmtree(deploy, ignore_errors=True)
                shutil.rmtree(dest.parent, ignore_errors=True)

            def check(result) -> None:  # end to end: the files in DEST are the bytes first written
                got = {p.name: _file_sha256(p) for p in dest.iterdir()}
                if got != sums or result.stdout.strip() != str(dest):
                    raise SystemExit(f"pull {i}: DEST does not hold the artifact's bytes ({result.stdout.strip()})")

            seconds = timed([*trtbuild, "pull", str(recipe.with_suffix(".lock")), "--target", "base-tp1",
                             "--store", f"s3://{BUCKET}/trtbuild-0", "--dest", str(dest)],
                            {**env, "TRTBUILD_CACHE": str(deploy)}, before=fresh, after=check)
            fresh()
            return seconds

        t_pull, pull_runs = median_of(args.repeat, pull_once)

        # ---- awscli ----------------------------------------------------------------------------------
        def aws_up(i: int) -> float:
            return timed(["aws", "s3", "cp", "--recursive", "--quiet", str(art), f"s3://{BUCKET}/awscli-{i}/"], base_env)

        def aws_down(i: int) -> float:
            down = tmp / "aws-down"
            seconds = timed(["aws", "s3", "cp", "--recursive", "--quiet", f"s3://{BUCKET}/awscli-0/", str(down)],
                            base_env, before=lambda: shutil.rmtree(down, ignore_errors=True))
            if {p.name for p in down.iterdir()} != set(sums):
                raise SystemExit("aws s3 cp did not download every file")
            shutil.rmtree(down)
            return seconds

        t_aws_up = t_aws_down = None
        aws_up_runs, aws_down_runs = [], []
        if aws_version:
            t_aws_up, aws_up_runs = median_of(args.repeat, aws_up)
            t_aws_down, aws_down_runs = median_of(args.repeat, aws_down)
            for i in range(args.repeat):
                empty_prefix(client, f"awscli-{i}/")

        # ---- raw boto3 ---------------------------------------------------------------------------
        manifest = local.get_manifest(checkpoint.digest)
        pairs = [part for e in manifest.entries for part in (f"trtbuild-0/cas/sha256/{e.sha256[:2]}/{e.sha256}", e.path)]

        def raw_down(i: int) -> float:
            down = tmp / "raw-down"

            def fresh() -> None:
                shutil.rmtree(down, ignore_errors=True)
                down.mkdir()

            seconds = timed([sys.executable, "-c", RAW_DOWNLOAD, BUCKET, str(defaults.download_chunk),
                             str(defaults.concurrency), str(down), *pairs], base_env, before=fresh)
            shutil.rmtree(down)
            return seconds

        t_raw, raw_runs = median_of(args.repeat, raw_down)

        # ---- pull --target auto: choosing for this host --------------------------------------------
        lock200 = project / "matrix.lock"
        expected = big_lock(lock200, recipe)
        site = tmp / "site-packages"  # what an installed tensorrt_llm / tensorrt leave: their metadata
        for name, version in (("tensorrt_llm", TRTLLM), ("tensorrt", TRT)):
            (site / f"{name}-{version}.dist-info").mkdir(parents=True)
            (site / f"{name}-{version}.dist-info" / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        host_env = {**env, "STANDIN_NVML_GPU": "H100", "STANDIN_NVML_COUNT": "1",
                    "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "standin_nvml"), str(site), env["PYTHONPATH"]])}
        choose = [*trtbuild, "pull", str(lock200), "--store", f"s3://{BUCKET}/trtbuild-0", "--dry-run"]

        def chose_expected(result) -> None:
            if not result.stdout.startswith(f"would pull {expected} "):
                raise SystemExit(f"pull --target auto chose {result.stdout.strip()!r}, not {expected}")

        runs = 1 if args.smoke else max(args.repeat, 7)
        timed(choose, host_env, after=chose_expected)  # warm-up, untimed (as the start-up below)
        timed([sys.executable, "-c", "pass"], base_env)
        t_start, start_runs = median_of(runs, lambda i: timed([sys.executable, "-c", "pass"], base_env))
        t_choose, choose_runs = median_of(runs, lambda i: timed(choose, host_env, after=chose_expected))
        local_choose = [*trtbuild, "pull", str(lock200), "--store", str(local.root), "--dry-run"]
        t_choose_local, _ = median_of(runs, lambda i: timed(local_choose, host_env, after=chose_expected))

    figures.update({
        "push_s": t_push, "repush_s": t_repush, "pull_s": t_pull, "awscli_up_s": t_aws_up, "awscli_down_s": t_aws_down,
        "raw_boto3_down_s": t_raw, "runs": {"push": push_runs, "repush": repush_runs, "pull": pull_runs,
                                            "awscli_up": aws_up_runs, "awscli_down": aws_down_runs, "raw_boto3_down": raw_runs,
                                            "python_c_pass": start_runs, "choose": choose_runs},
        "push_mb_s": total / t_push / MB, "pull_mb_s": total / t_pull / MB, "raw_boto3_down_mb_s": total / t_raw / MB,
        "pull_vs_raw_boto3": t_pull / t_raw,
        "python_c_pass_s": t_start, "choose_s": t_choose, "choose_beyond_start_s": t_choose - t_start,
        "choose_local_store_s": t_choose_local, "choose_targets": 200, "chosen": expected,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    })
    goals = {}
    if aws_version:
        figures.update({"awscli_up_mb_s": total / t_aws_up / MB, "awscli_down_mb_s": total / t_aws_down / MB,
                        "push_vs_awscli": t_aws_up / t_push, "pull_vs_awscli": t_aws_down / t_pull})
        goals.update({"push >= 1.0x awscli": figures["push_vs_awscli"] >= 1.0,
                      "pull >= 1.0x awscli": figures["pull_vs_awscli"] >= 1.0})
    goals.update({"re-push < 1 s": t_repush < 1.0,
             "pull <= 1.10x raw boto3 time": figures["pull_vs_raw_boto3"] <= 1.10,
                  "choose < 0.5 s beyond start": figures["choose_beyond_start_s"] < 0.5})
    figures["goals"] = goals
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_table(figures)
    ok = all(goals.values())
    verdict = "OK: every goal met" if ok else f"MISSED: {', '.join(g for g, met in goals.items() if not met)}"
    print(verdict + (" (--smoke: goals not judged)" if args.smoke else ""), file=sys.stderr if args.json else sys.stdout)
    return 0 if ok or args.smoke else 1


def _file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def print_table(f: dict) -> None:
    s3 = f["trtbuild_s3"]
    print(f"artifact: {f['files']} files, {f['bytes'] / 1024**3:.3g} GiB; cores: {f['cores']}; python {f['python']}; "
          f"{f['awscli'] or 'no awscli (its rows left out)'}; load average (1, 5, 15 min) {f['load_average_start']} at the "
          f"start, {f['load_average_end']} at the end")
    print(f"trtbuild: {f['how']}; S3Store part_size {s3['part_size'] >> 20} MiB, concurrency {s3['concurrency']}, "
          f"download_chunk {s3['download_chunk'] >> 20} MiB")
    print(f"median of {f['repeat']} runs (process start-up included everywhere)")
    aws = f["awscli"] is not None  # else (--smoke without awscli) its rows are left out
    rows = [("trtbuild push (cold)", f["push_s"], f["push_mb_s"],
             f"{f['push_vs_awscli']:.2f}x awscli  goal >= 1.0x" if aws else ""),
            ("aws s3 cp --recursive (up)", f["awscli_up_s"], f.get("awscli_up_mb_s"), ""),
            ("trtbuild push (unchanged)", f["repush_s"], None, "goal < 1 s"),
            ("trtbuild pull --dest (verified)", f["pull_s"], f["pull_mb_s"],
             (f"{f['pull_vs_awscli']:.2f}x awscli  goal >= 1.0x; " if aws else "") +
             f"{f['pull_vs_raw_boto3']:.2f}x raw boto3's time  goal <= 1.10x"),
            ("aws s3 cp --recursive (down)", f["awscli_down_s"], f.get("awscli_down_mb_s"), ""),
            ("raw boto3 transfer manager (down)", f["raw_boto3_down_s"], f["raw_boto3_down_mb_s"], "nothing verified or fsynced")]
    for name, seconds, rate, note in rows:
        if seconds is None:
            continue
        speed = f"{rate:8.1f} MB/s" if rate is not None else " " * 13
        print(f"{name:34} {seconds:8.3f} s {speed}  {note}")
    print(f"{'python -c pass':34} {f['python_c_pass_s']:8.3f} s")
    print(f"{'pull --target auto --dry-run':34} {f['choose_s']:8.3f} s  {f['choose_beyond_start_s']:.3f} s beyond start, "
          f"{f['choose_targets']} targets, chose {f['chosen']}  goal < 0.5 s")
    print(f"{'  (the same, --store a local folder)':34} {f['choose_local_store_s']:8.3f} s")


if __name__ == "__main__":
    sys.exit(main())
