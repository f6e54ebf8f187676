"""hf-checkpoint:package: an hf-export's files plus serving/ (the loader check, and the runtime options
and serve commands of the runtimes whose loader accepts the checkpoint; the README names the others
with the reason). A checkpoint with defects (serving_check.defects: a tensor missing or wrong that a
loader might load anyway) is refused, in one line naming it and its first defect. The stage writes only serving/; the runner overlays it on the export's manifest
(Stage.overlay), so the weights are neither copied nor hashed again. No torch: it runs in-process."""

from __future__ import annotations

import json

from trtbuild.serving import options as serving_options
from trtbuild.errors import TrtbuildError
from trtbuild.facts.serving import RUNTIME_NAMES
from trtbuild.serving.check import check_checkpoint
from trtbuild.builder.stages.base import OVERLAY_SUMMARY, StageContext
from trtbuild.store.summaries import Serving

CHECK_FILE = f"{serving_options.SERVING_DIR}/check.json"


def loader_check(folder) -> tuple[dict, dict[str, list[str]]]:
    """The runtimes' loader rules applied to the export, on every SM (the artifact serves any GPU;
    the plan already checked the recipe's): the whole result, and {runtime: SMs it serves}."""
    checked = check_checkpoint(folder)
    result = checked.as_json()
    result["folder"] = "."  # the checkout's path differs per store: the artifact holds only what its key names
    return result, checked.serves()


def package_hf(ctx: StageContext) -> None:
    weights = ctx.inputs["weights"]
    check, serves = loader_check(weights)
    if check["defects"]:  # a loader may take it, but what it would serve is not the checkpoint: never packaged
        raise TrtbuildError(f"{weights}: not packaged: {check['defects'][0]}"
                            + (f" (and {len(check['defects']) - 1} more defects)" if len(check["defects"]) > 1 else ""))
    accepted = {runtime: verdict["accepted"] for runtime, verdict in check["runtimes"].items()}
    first_reason = {runtime: (verdict["reasons"] or ["not served"])[0] for runtime, verdict in check["runtimes"].items()}
    if not any(accepted.values()):  # the table said a runtime serves it: the export is what is wrong
        reasons = "; ".join(f"{RUNTIME_NAMES[r]}: {first_reason[r]}" for r in check["runtimes"])
        raise TrtbuildError(f"no runtime loads this checkpoint: {reasons}")
    # A runtime whose loader refuses the checkpoint gets no command: the README names it and why.
    refused = {runtime: first_reason[runtime] for runtime, ok in accepted.items() if not ok}
    written = serving_options.write_serving(ctx.out, ctx.params, refused)
    (ctx.out / CHECK_FILE).write_text(json.dumps(check, indent=2, sort_keys=True) + "\n")
    written.append(CHECK_FILE)
    serving = Serving(files=written, runtimes=ctx.params["runtimes"], check=accepted,
                      serves=serves)  # the lock, `ls` and `pull` read serves
    # the stage's own part of the summary: the runner adds it to the export's (HfCheckpointSummary)
    ctx.report({"serving": serving.model_dump(mode="json")}, name=OVERLAY_SUMMARY)
