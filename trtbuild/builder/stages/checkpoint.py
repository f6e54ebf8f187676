"""Checkpoint stages: calibration windows, the quantized model, and the checkpoints built from it.

Each entry point runs in a worker process (ModelOpt and torch stay out of the runner): an
out-of-memory or a crash fails the stage, not the build.

- `make_windows`: the calibration set as token ids (its digest, not the text's path, keys what follows).
- `quantize`: ModelOpt calibration in the recipe's dtype; stores the ModelOpt state, not the weights.
- `convert_checkpoint`: an unquantized TensorRT-LLM checkpoint, streamed tensor by tensor (also the
  float checkpoint of a format TensorRT-LLM quantizes at load: int8_wo, `quant_algo: W8A16`).
- `export_checkpoint`: a quantized TensorRT-LLM checkpoint, exported from the restored quantized model.
- `convert_hf` / `export_hf`: the Hugging Face form (for TensorRT-LLM's PyTorch backend, vLLM, SGLang).

TensorRT-LLM checkpoints are corrected (rope, Qwen fields: reference/modelopt.md section 6) and
verified (names, shapes and dtypes per rank) before they are stored.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from trtbuild.builder.stages.base import StageContext
from trtbuild.builder.stages.worker import report_progress
from trtbuild.store.summaries import CalibrationSummary, CheckpointSummary, HfExportSummary, QuantizeSummary



def _hf_config(source: Path) -> dict:
    from trtbuild.model.config import read_json_object

    return read_json_object(source / "config.json")


def make_windows(ctx: StageContext) -> None:
    from trtbuild.checkpoint import calibration

    text = calibration.read_text(ctx.runtime.text, Path(ctx.runtime.base_dir))
    ids, meta = calibration.make_windows(ctx.inputs["source"], text, ctx.params["samples"], ctx.params["seq_len"],
                                         ctx.params["seed"])
    calibration.save_windows(ctx.out, ids, meta)
    ctx.report(CalibrationSummary(**{**meta, "samples": int(ids.shape[0]), "seq_len": int(ids.shape[1])},
                                  text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest()))


def quantize(ctx: StageContext) -> None:
    from trtbuild.host import hardware
    from trtbuild.checkpoint import calibration, quantize as mq
    from trtbuild.builder.stages import models

    started = time.monotonic()
    device = hardware.resolve_device(ctx.runtime.device or "auto")
    windows = calibration.load_windows(ctx.inputs["calibration"])
    dtype = ctx.params["dtype"]
    model = models.take(models.source_key(ctx.runtime.input_digests["source"], dtype),
                        lambda: mq.load_model(ctx.inputs["source"], dtype, device))
    models.on_device(model, device)
    report = mq.calibrate_and_quantize(model, ctx.params["quant"], ctx.params["kv_cache"], ctx.params.get("group_size"),
                                       windows, device, progress=lambda done, total: report_progress(done, total, "calibration batches"))
    mq.save_quantized(model, ctx.out)
    # exactly what restore_quantized rebuilds from this folder (save_quantized pinned every
    # parameter's sha256): the exports and validation after this stage start from it
    models.keep(models.quantized_key(ctx.out, dtype), model)
    ctx.tool_report(QuantizeSummary, report, device=device)
    ctx.measure(calibration_seconds=round(time.monotonic() - started, 2))


def verify(out: Path, hf_config: dict) -> None:
    """verify_trtllm_checkpoint, with every problem in the stage's log: the failure itself is one
    line (the first problem and how many more), to which the runner adds the log's path."""
    from trtbuild.checkpoint.verify import CheckpointInvalid, verify_trtllm_checkpoint

    try:
        verify_trtllm_checkpoint(out, hf_config)
    except CheckpointInvalid as exc:
        print(f"verify: {out.name}: {len(exc.problems)} problem(s):", flush=True)
        for problem in exc.problems:
            print(f"verify:   {problem}", flush=True)
        raise


def _fix_and_verify(out: Path, source: Path, ctx: StageContext) -> list[str]:
    from trtbuild.checkpoint.trtllm_config import fix_trtllm_config

    hf_config = _hf_config(source)
    requested = {"dtype": ctx.params["dtype"], "tp": ctx.params["tp"], "pp": ctx.params["pp"]}
    changed = fix_trtllm_config(out, hf_config, requested)
    verify(out, hf_config)
    return changed


def convert_checkpoint(ctx: StageContext) -> None:
    from trtbuild.checkpoint.trtllm_convert import convert_hf_to_trtllm

    source = ctx.inputs["source"]
    shown = {"percent": -1}

    def progress(written: int, total: int) -> None:  # a line per percent, not per block
        percent = written * 100 // max(total, 1)
        if percent != shown["percent"]:
            shown["percent"] = percent
            report_progress(written >> 20, max(total >> 20, 1), "MiB written")

    report = convert_hf_to_trtllm(source, ctx.out, ctx.params["tp"], ctx.params["pp"], ctx.params["dtype"], progress,
                                  quant=ctx.params.get("quant"))
    changed = _fix_and_verify(ctx.out, source, ctx)
    ctx.tool_report(CheckpointSummary, report, config_fixes=changed)


def export_checkpoint(ctx: StageContext) -> None:
    from trtbuild.checkpoint import quantize as mq
    from trtbuild.builder.stages import models

    source = ctx.inputs["source"]
    quantized = models.quantized(source, ctx.inputs["quantized"], ctx.params["dtype"], "cpu")
    # on a deep copy (the export rewrites weights and amax): the kept model stays as it is
    report = mq.export_trtllm(quantized, ctx.out, ctx.params["tp"], ctx.params["pp"], ctx.params["dtype"])
    verify(ctx.out, _hf_config(source))
    fixes = report.pop("patched")
    ctx.tool_report(CheckpointSummary, report, config_fixes=fixes)


def convert_hf(ctx: StageContext) -> None:
    from trtbuild.checkpoint.hf_cast import cast_checkpoint

    report = cast_checkpoint(ctx.inputs["source"], ctx.out, ctx.params["dtype"])
    ctx.tool_report(HfExportSummary, report)


def export_hf(ctx: StageContext) -> None:
    from trtbuild.checkpoint import quantize as mq
    from trtbuild.builder.stages import models

    source = ctx.inputs["source"]
    quantized = models.quantized(source, ctx.inputs["quantized"], ctx.params["dtype"], "cpu")
    report = mq.export_hf(quantized, ctx.out, source)  # on a deep copy: the kept model stays as it is
    ctx.tool_report(HfExportSummary, report)
