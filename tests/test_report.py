"""The accuracy report: report.html (self-contained, the build matrix as a table) and report.png."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest


from conftest import key_fields
from trtbuild.report.html import render_report  # noqa: E402

GIB = 1024**3
GATES_OK = {
    "kld_mean": {"value": 0.012, "limit": 0.05, "passed": True},
    "top1_agreement": {"value": 0.981, "limit": 0.95, "passed": True},
}
GATES_FAILED = {
    "kld_mean": {"value": 0.312, "limit": 0.05, "passed": False},
    "top1_agreement": {"value": 0.902, "limit": 0.95, "passed": False},
}


def _row(target, kind, variant, status, **kw):
    base = {"target": target, "kind": kind, "variant": variant, "quant": None, "kv_cache": None, "tp": None,
            "pp": None, "gpu": None, "status": status, "size_bytes": None, "weights_bytes_per_gpu": None,
            "kv_tokens": None, "kld_mean": None, "kld_p99": None, "top1_agreement": None,
            "ppl_delta_pct": None, "gates": None, "measured_by": None, "serves": None, "reason": None}
    base.update(kw)
    return base


ROWS = [
    _row("bf16", "hf-checkpoint", "bf16", "cached", size_bytes=int(14.96 * GIB), weights_bytes_per_gpu=int(14.96 * GIB),
         serves="trtllm>=1.3 sm89 sm90; vllm sm89 sm90"),
    _row("fp8", "checkpoint", "fp8", "built", quant="fp8", kv_cache="fp8", size_bytes=int(8.49 * GIB),
         weights_bytes_per_gpu=int(8.49 * GIB), kld_mean=0.012, kld_p99=0.21, top1_agreement=0.981,
         ppl_delta_pct=0.84, gates=GATES_OK),
    _row("fp8-tp1-sm90", "engine", "fp8", "built", quant="fp8", kv_cache="fp8", tp=1, pp=1, gpu="sm90",
         size_bytes=int(8.61 * GIB), weights_bytes_per_gpu=int(8.49 * GIB), kv_tokens=1_245_184, kld_mean=0.012,
         kld_p99=0.21, top1_agreement=0.981, ppl_delta_pct=0.84, gates=GATES_OK, measured_by="tensorrt_llm 1.2.1"),
    _row("int4-awq", "checkpoint", "int4-awq", "built", quant="int4_awq", size_bytes=int(5.73 * GIB),
         weights_bytes_per_gpu=int(5.73 * GIB), kld_mean=0.312, kld_p99=4.7, top1_agreement=0.902,
         ppl_delta_pct=7.9, gates=GATES_FAILED),
    _row("int4-awq-tp2-sm90", "engine", "int4-awq", "failed", quant="int4_awq", tp=2, pp=1, gpu="sm90",
         weights_bytes_per_gpu=int(2.9 * GIB), reason="engine build ran out of memory <OOM & co>"),
    _row("nvfp4", "checkpoint", "nvfp4", "skipped", quant="nvfp4", weights_bytes_per_gpu=int(5.2 * GIB),
         reason="--only fp8,int4-awq"),
    _row("bf16-tp1-sm89", "engine", "bf16", "impossible", tp=1, pp=1, gpu="sm89",
         weights_bytes_per_gpu=int(14.96 * GIB), reason="needs 15.0 GiB of weights per GPU; sm89 has 24 GiB, "
         "leaving no room for the KV cache"),
]
N = len(ROWS)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0], "IHDR CRC mismatch"
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82", "no IEND chunk at the end"
    return width, height


class Page(HTMLParser):
    """The matrix table as lists of cell texts, plus every tag's attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.in_matrix = self.in_body = False
        self.header: list[str] = []
        self.rows: list[list[str]] = []
        self.row_classes: list[str] = []
        self.cell: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "table" and a.get("id") == "matrix":
            self.in_matrix = True
        elif self.in_matrix and tag == "tbody":
            self.in_body = True
        elif self.in_matrix and tag == "tr" and self.in_body:
            self.rows.append([])
            self.row_classes.append(a.get("class", ""))
        elif self.in_matrix and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag == "table" and self.in_matrix:
            self.in_matrix = False
        elif tag == "tbody":
            self.in_body = False
        elif tag in ("td", "th") and self.cell is not None:
            text = " ".join(" ".join(self.cell).split())
            (self.rows[-1] if self.in_body else self.header).append(text)
            self.cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    html_path, png_path = render_report("Llama-3.1-8B <instruct> & friends", ROWS, out / "site")
    return html_path, png_path


def test_report_files_table_and_plot(report):
    html_path, png_path = report
    assert html_path == html_path.parent / "report.html" and png_path == html_path.parent / "report.png"
    width, height = _png_size(png_path)
    assert 600 <= width <= 3000 and 300 <= height <= 2000, (width, height)
    assert png_path.stat().st_size > 10_000

    source = html_path.read_text(encoding="utf-8")
    page = Page()
    page.feed(source)
    page.close()

    # Self-contained: no scripts, no external references; the only resource is the PNG next to it.
    assert "<script" not in source.lower() and "http://" not in source and "https://" not in source
    assert "url(" not in source and "@import" not in source
    srcs = [a.get("src") or a.get("href") for t, a in page.tags if a.get("src") or a.get("href")]
    assert srcs == ["report.png"]
    img = next(a for t, a in page.tags if t == "img")
    assert "int4-awq" in img["alt"] and "fp8" in img["alt"]
    # Every string is escaped: the title and the reason come back as text, not markup.
    assert "<instruct>" not in source and "<OOM" not in source
    assert "Llama-3.1-8B <instruct> & friends" in "".join(page.text)

    assert page.header[:5] == ["target", "kind", "gpu", "tp/pp", "status"]
    assert page.header[-4:] == ["gates", "measured by", "serves", "reason"] and len(page.header) == 16
    assert len(page.rows) == N and all(len(r) == 16 for r in page.rows)
    cells = {r[0].split()[0]: dict(zip(page.header, r)) for r in page.rows}
    assert list(cells) == [r["target"] for r in ROWS]

    assert cells["bf16"]["serves"] == "trtllm>=1.3 sm89 sm90; vllm sm89 sm90" and cells["fp8"]["serves"] == "–"
    fp8 = cells["fp8-tp1-sm90"]
    assert fp8["kind"] == "engine" and fp8["gpu"] == "sm90" and fp8["tp/pp"] == "1/1"
    assert fp8["size on disk"] == "8.61 GiB" and fp8["KV tokens"] == "1,245,184"
    assert fp8["KL mean"] == "0.0120" and fp8["KL p99"] == "0.210"
    assert fp8["top-1 agreement"] == "98.1%" and fp8["ppl Δ%"] == "+0.840%"
    assert fp8["gates"].startswith("passed") and "FAILED" not in fp8["gates"]
    assert fp8["measured by"] == "tensorrt_llm 1.2.1" and cells["int4-awq"]["measured by"] == "–"

    awq = cells["int4-awq"]
    assert awq["gates"].startswith("FAILED")
    assert "KL mean 0.312 > limit 0.0500" in awq["gates"]
    assert "top-1 agreement 90.2% < limit 95.0%" in awq["gates"]
    assert "row-failed" in page.row_classes[3]

    failed = cells["int4-awq-tp2-sm90"]
    assert failed["status"] == "FAILED" and failed["size on disk"] == "–"
    assert failed["est. weights/GPU"] == "2.90 GiB" and failed["gates"] == "not validated"
    assert failed["reason"] == "engine build ran out of memory <OOM & co>"
    assert "row-failed" in page.row_classes[4]

    skipped, impossible = cells["nvfp4"], cells["bf16-tp1-sm89"]
    assert skipped["status"] == "skipped" and skipped["KL mean"] == "–" and skipped["gates"] == "not validated"
    assert impossible["status"] == "impossible" and "sm89 has 24 GiB" in impossible["reason"]
    assert cells["bf16"]["size on disk"] == "15.0 GiB"

    text = " ".join("".join(page.text).split())
    assert "7 targets: 2 passed gates, 1 FAILED gates, 4 not validated" in text
    # The plot is described in text, including what it leaves out.
    assert "Left out of the plot:" in text
    for target in ("bf16 (no metrics)", "nvfp4 (no metrics)", "bf16-tp1-sm89 (no metrics)"):
        assert target in text
    assert "int4-awq: 5.73 GiB on disk, KL mean 0.312, top-1 agreement 90.2%, perplexity change +7.90%, gates FAILED" in text
    assert "Dashed lines: gate limits (KL mean ≤ 0.0500; top-1 agreement ≥ 95.0%)" in text


def test_report_without_metrics_still_renders(tmp_path):
    rows = [ROWS[0], ROWS[5]]
    html_path, png_path = render_report("nothing validated", rows, tmp_path)
    assert _png_size(png_path)[0] >= 600
    page = Page()
    page.feed(html_path.read_text(encoding="utf-8"))
    assert len(page.rows) == 2
    assert "No target has accuracy metrics yet" in "".join(page.text)


def test_report_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    from trtbuild.errors import TrtbuildError

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    with pytest.raises(TrtbuildError, match=r"pip install 'trtbuild\[report\]'"):
        render_report("t", ROWS, tmp_path)


CHROMIUM = shutil.which("chromium")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Debian's chromium, headless, with everything that phones home switched off; the page is a local
    file without external references, so nothing reaches the network."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", *args]
    env = {**os.environ, "HOME": str(profile)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_in_headless_chromium(report, tmp_path):
    html_path, _ = report
    url = html_path.resolve().as_uri()

    dom = _chromium(tmp_path / "profile-dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page()
    page.feed(dom.stdout)
    assert len(page.rows) == N, dom.stdout[:2000]
    table = dom.stdout[dom.stdout.index('<table id="matrix"'):dom.stdout.index("</table>")]
    assert table.count("<tr") == N + 1  # the header row and one per target
    assert "FAILED" in table and "KL mean 0.312 &gt; limit 0.0500" in table

    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,1000",
                    "--hide-scrollbars", url)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    assert _png_size(shot) == (1400, 1000)
    assert shot.stat().st_size > 20_000  # a blank page is a few KB; the table and the plot are not


def test_a_hand_edited_lock_is_refused_with_one_line(tmp_path):
    """A lock whose entries are not what trtbuild writes: one line naming the file and the field."""
    from trtbuild.errors import InvalidInput
    from trtbuild.lock.lockfile import read

    lock = tmp_path / "r.lock"
    lock.write_text("schema: 4\nrecipe: {name: r, digest: d}\nsource: null\ntoolchain: {}\nvalidation: run\n"
                    "targets: {base-tp1: garbage}\n")
    with pytest.raises(InvalidInput) as caught:
        read(lock)
    assert str(caught.value) == (f"{lock}: targets.base-tp1: Input should be a valid dictionary or instance of "
                                 "LockedTarget (edited by hand? rebuild without --locked to rewrite it)")
    lock.write_text("schema: 1\ntargets: {}\n")  # an older layout: a build rewrites it, --locked refuses it
    assert read(lock, older_ok=True) is None
    with pytest.raises(InvalidInput, match="not a trtbuild lock file of schema 4"):
        read(lock)


def _gates(kl_limit, top1_limit, ppl_limit, passed=True):
    return {"kld_mean": {"value": 0.0, "limit": kl_limit, "passed": passed},
            "top1_agreement": {"value": 1.0, "limit": top1_limit, "passed": True},
            "ppl_delta_pct": {"value": 0.0, "limit": ppl_limit, "passed": True}}


def _figure_of(rows):
    pytest.importorskip("matplotlib")
    from trtbuild.report.collect import ReportRow
    from trtbuild.report.plot import accuracy_figure, plot_points

    points, _ = plot_points([ReportRow.model_validate(row) for row in rows])
    return accuracy_figure("demo", points)


def test_the_plot_has_a_perplexity_change_panel_and_draws_every_gate_limit():
    # Two quantization families: 8-bit gates (0.15, 80%, 15%) and 4-bit gates (0.5, 65%, 50%).
    rows = [
        _row("fp8-tp1", "checkpoint", "fp8", "built", quant="fp8", size_bytes=200 * 2**20, kld_mean=0.043,
             top1_agreement=0.89, ppl_delta_pct=3.8, gates=_gates(0.15, 0.8, 15)),
        _row("int8-wo-tp1", "checkpoint", "int8-wo", "built", quant="int8_wo", size_bytes=210 * 2**20, kld_mean=0.0026,
             top1_agreement=0.97, ppl_delta_pct=0.4, gates=_gates(0.15, 0.8, 15)),
        _row("int4-tp1", "checkpoint", "int4", "built", quant="int4_awq", size_bytes=120 * 2**20, kld_mean=0.3,
             top1_agreement=0.7, ppl_delta_pct=21.0, gates=_gates(0.5, 0.65, 50)),
    ]
    fig, info = _figure_of(rows)
    ax_kl, ax_top1, ax_ppl = fig.axes
    assert ax_ppl.get_ylabel() == "perplexity change (%)"
    # every variant's perplexity change is plotted at its size
    offsets = sorted(tuple(xy) for c in ax_ppl.collections for xy in c.get_offsets().tolist())
    assert offsets == [(120.0, 21.0), (200.0, 3.8), (210.0, 0.4)]

    def gate_lines(ax):
        return {line.get_label(): line.get_ydata()[0] for line in ax.get_lines() if line.get_label().startswith("gate")}

    assert gate_lines(ax_kl) == {"gate: KL mean ≤ 0.150 (fp8, int8-wo)": 0.15, "gate: KL mean ≤ 0.500 (int4)": 0.5}
    assert gate_lines(ax_top1) == {"gate: top-1 ≥ 80.0% (fp8, int8-wo)": 0.8, "gate: top-1 ≥ 65.0% (int4)": 0.65}
    assert gate_lines(ax_ppl) == {"gate: ppl change ≤ 15% (fp8, int8-wo)": 15, "gate: ppl change ≤ 50% (int4)": 50}
    # the legend of each panel shows them
    for ax in fig.axes:
        assert {t.get_text() for t in ax.get_legend().get_texts()} == set(gate_lines(ax))


def test_one_shared_gate_limit_is_labelled_without_variants():
    rows = [_row("fp8-tp1", "checkpoint", "fp8", "built", size_bytes=2**30, kld_mean=0.01, top1_agreement=0.95,
                 ppl_delta_pct=1.0, gates=_gates(0.15, 0.8, 15)),
            _row("int8-tp1", "checkpoint", "int8", "built", size_bytes=2**30, kld_mean=0.02, top1_agreement=0.93,
                 ppl_delta_pct=2.0, gates=_gates(0.15, 0.8, 15))]
    fig, _ = _figure_of(rows)
    labels = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert labels == ["gate: KL mean ≤ 0.150", "gate: top-1 ≥ 80.0%", "gate: ppl change ≤ 15%"]


def test_the_rows_fail_a_target_any_validation_of_which_failed_and_say_which_runner_on_which_device(tmp_path):
    """A target fails when any validation that ran failed its gates, not only the one whose numbers a
    row shows; the numbers are the runtime's before torch's (a failed one's first: they say why), and
    `measured by` names the runner and the device it computed on."""
    import json

    from conftest import TINY_LLAMA
    from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe
    from trtbuild.store.records import ActionRecord, Digest, Execution
    from trtbuild.report.collect import rows
    from trtbuild.store.local import LocalStore
    from summarykit import validation_summary

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {path: model}\ngpus: [sm90]\nbackends: [hf-checkpoint]\n"
                      "variants: {bf16: {}, fp8: {quant: fp8}}\nlimits: {max_input_len: 64, max_seq_len: 128}\n")
    plan = plan_recipe(load_recipe(recipe))
    store = LocalStore(tmp_path / "store")
    store.create()
    targets = {}

    def add(node: str, summary: dict) -> None:
        folder = tmp_path / "art" / node.replace(":", "_")
        folder.mkdir(parents=True)
        (folder / "x").write_text(node)
        manifest = store.ingest(folder)
        key = f"{len(targets) + 1:064x}"
        store.put_record(ActionRecord(key=key, artifact=Digest(hash=manifest.digest, size_bytes=manifest.size),
                                      stage="validate" if ":" in node else "hf-checkpoint:package", stage_version=1,
                                      target=node, recipe="r", created="2026-12-03T12:00:00Z", toolchain={},
                                      summary=summary, fields=key_fields(), execution=Execution(seconds=1.0, host="h")))
        passed = summary["gates"]["kld_mean"]["passed"] if "gates" in summary else None
        targets[node] = LockedTarget(stage="validate" if ":" in node else "hf-checkpoint", key=key,
                                     digest=manifest.digest, size=manifest.size, gates_passed=passed)

    def validation(kl: float, runner: str, device: str) -> dict:
        return validation_summary(kl, runner=runner, device=device)

    add("bf16-hf", {})
    add("bf16-hf:validate", validation(0.001, "torch", "cpu"))
    add("bf16-hf:validate-vllm", validation(0.002, "vllm 0.26.0", "cuda:0"))  # TensorRT-LLM's did not run
    add("fp8-hf", {})
    add("fp8-hf:validate", validation(0.01, "torch", "cpu"))
    add("fp8-hf:validate-trtllm", validation(0.02, "tensorrt_llm 1.3.0", "cuda:0"))
    add("fp8-hf:validate-vllm", validation(0.09, "vllm 0.26.0", "cuda:0"))  # fails, though TensorRT-LLM's passed
    lock = LockFile(recipe=LockedRecipe(name="r", digest="d"), source=None, toolchain={}, targets=targets,
                    validation="run")
    shown = {row.target: (row.status, row.kld_mean, row.measured_by) for row in rows(plan, store, lock)}
    assert shown == {"bf16-hf": ("built", 0.002, "vllm 0.26.0 on cuda:0"),
                     "fp8-hf": ("failed", 0.09, "vllm 0.26.0 on cuda:0")}
    del lock.targets["fp8-hf:validate-vllm"]  # TensorRT-LLM's figures come first
    shown = {row.target: (row.status, row.kld_mean, row.measured_by) for row in rows(plan, store, lock)}
    assert shown["fp8-hf"] == ("built", 0.02, "tensorrt_llm 1.3.0 on cuda:0")


def test_serves_names_the_recipes_sms_as_plan_does_with_the_builds_loader_verdict(tmp_path):
    """Issue #23: the serves column listed every SM the build's loader check judged (sm80 ... sm120
    for three runtimes: tall rows) where plan lists the recipe's `gpus:`. The check's verdict on the
    recipe's SMs, in plan's words: a runtime the check refused on an SM loses it there."""
    import json

    from conftest import TINY_LLAMA
    from trtbuild.lock.lockfile import LockedRecipe, LockedTarget, LockFile
    from trtbuild.plan.expand import plan_recipe
    from trtbuild.recipe.schema import load_recipe
    from trtbuild.report.collect import rows
    from trtbuild.store.local import LocalStore

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY_LLAMA))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema: 1\nname: r\nsource: {path: model}\ngpus: [sm89, sm90]\nbackends: [hf-checkpoint]\n"
                      "variants: {bf16: {}, fp8: {quant: fp8}}\nlimits: {max_input_len: 64, max_seq_len: 128}\n")
    plan = plan_recipe(load_recipe(recipe))
    store = LocalStore(tmp_path / "store")
    store.create()
    every = ["sm80", "sm86", "sm89", "sm90", "sm100", "sm120"]
    checked = {"bf16-hf": {"trtllm": every, "vllm": every, "sglang": every},
               "fp8-hf": {"trtllm": ["sm89", "sm90", "sm100", "sm120"], "vllm": ["sm80", "sm86", "sm90", "sm120"]}}
    lock = LockFile(recipe=LockedRecipe(name="r", digest="d"), source=None, toolchain={}, validation="run",
                    targets={name: LockedTarget(stage="hf-checkpoint", key=f"{i:064x}", digest=f"{i:064x}", size=1,
                                                serves=serves) for i, (name, serves) in enumerate(checked.items(), 1)})
    shown = {row.target: row.serves for row in rows(plan, store, lock)}
    assert shown == {"bf16-hf": "trtllm>=1.3 sm89 sm90; vllm sm89 sm90; sglang sm89 sm90",
                     "fp8-hf": "trtllm>=1.3 sm89 sm90; vllm sm90"}
    unbuilt = {row.target: row.serves for row in rows(plan, store, None)}  # the plan's own line
    assert unbuilt == {t.name: t.serves_line() for t in plan.targets} == {
        "bf16-hf": "trtllm>=1.3 sm89 sm90; vllm sm89 sm90; sglang sm89 sm90",
        "fp8-hf": "trtllm>=1.3 sm89 sm90; vllm sm89 sm90; sglang sm89 sm90"}


def _gates_cell(tmp_path, row) -> str:
    pytest.importorskip("matplotlib")
    html_path, _ = render_report("t", [row], tmp_path)
    page = Page()
    page.feed(html_path.read_text(encoding="utf-8"))
    page.close()
    return dict(zip(page.header, page.rows[0]))["gates"]


def test_the_report_shows_the_stored_gate_verdict_and_never_compares_a_value_with_its_limit(tmp_path):
    """Gates are decided once (validate.gates.judge, when the validation ran): a gate stored as passed
    shows passed even where its value is past its limit, and a target whose stored verdict failed
    (the lock's gates_passed: another validation of it failed) shows FAILED though the gates shown passed."""
    past_the_limit = {"kld_mean": {"value": 0.5, "limit": 0.1, "passed": True}}
    row = _row("fp8", "checkpoint", "fp8", "built", kld_mean=0.5, gates=past_the_limit)
    assert _gates_cell(tmp_path / "a", row).startswith("passed")
    failed_elsewhere = _row("fp8", "checkpoint", "fp8", "failed", kld_mean=0.01, gates=GATES_OK, gates_passed=False)
    assert _gates_cell(tmp_path / "b", failed_elsewhere).startswith("FAILED")


def test_the_report_module_holds_no_gate_decision_of_its_own():
    """No comparison of a metric with a limit and no table of which limits are minimums in report/:
    validate/gates.py has both."""
    import inspect

    from trtbuild.report import html

    source = inspect.getsource(html)
    assert "HIGHER_IS_BETTER" not in source and "is_min" not in source
    assert not any(op in source for op in ('["value"] <', '["value"] >', "value <=", "value >="))
