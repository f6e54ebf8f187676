"""docs/runtimes.md, generated from the runtime table (trtbuild/data/runtime-support.json):
`python -m trtbuild.facts.runtimes_doc > docs/runtimes.md`. tests/test_serving.py keeps the committed page
equal to this output, so the page never says what the table does not."""

from __future__ import annotations

import sys

from trtbuild.facts import gpus, quantformats
from trtbuild.facts import serving

MARKS = "Y serves; Y* serves on a fallback kernel (see the note); - does not serve; ? not claimed (not verified, or sources disagree)"


def _mark(s: serving.Support) -> str:
    if s.serves:
        return "Y*" if s.note else "Y"
    return "?" if (s.reason or "").startswith("not claimed") else "-"


def _source_line(sid: str, src: serving.Source) -> str:
    if src.url:
        where = f"{src.url} (version {src.version})"
    else:
        at = f" at {src.commit}" if src.commit else " (no commit recorded)"
        ref = f" {src.ref}" if src.ref else ""
        where = f"{src.repo}{ref}{at}: `{src.path}`"
    text = f"- `{sid}`: {where}; {src.where}"
    return text + (f" (read from {src.read_from})" if src.read_from else "")


def _sms(sms) -> str:
    return " ".join(sms)


# One sentence per field a row has, in this order: (field, how it reads).
_ROW_SENTENCES = (
    ("serves", lambda row: f"serves {_sms(row.serves)}."),
    ("fallback", lambda row: f"{_sms(row.fallback)}: {row.fallback_note}."),
    ("unclaimed", lambda row: f"not claimed on {_sms(row.unclaimed)}: {row.unclaimed_why}."),
    ("reason", lambda row: f"elsewhere: {row.reason}."),
    ("options", lambda row: "needs " + ", ".join(f"{k} {v}" for k, v in sorted(row.options.items())) + "."),
    ("read", lambda row: f"Read: {row.read}."),
)


def _row_text(row: serving.SupportRow, key: str) -> list[str]:
    fmt = getattr(row, key) or "unquantized"
    parts = [f"- {serving.RUNTIME_INFO[row.runtime].title} {', '.join(row.versions)}, {fmt}:"]
    parts += [sentence(row) for field, sentence in _ROW_SENTENCES if getattr(row, field)]
    parts.append(f"Sources: {', '.join(row.cite)}.")
    return [" ".join(parts)]


def render() -> str:
    t = serving.table()
    sms = list(gpus.SM_ARCHES)
    lines = ["# Runtimes: who loads which Hugging Face checkpoint, on which GPU", "",
             "Generated from `trtbuild/data/runtime-support.json` (table version "
             f"{t.table_version}) by `python -m trtbuild.facts.runtimes_doc`; do not edit by hand.", "",
             t.about, "", "## Versions covered", ""]
    for name, r in serving.RUNTIME_INFO.items():
        lines.append(f"- {r.title} (`{r.label}`, package `{r.package}`): {', '.join(r.versions)}; "
                     f"default {r.default}. {r.version_note}.")
    lines += ["", "Any other version is refused in one line (`trtbuild check DIR --runtime vllm==0.40` exits 2; "
              "`trtbuild pull` names it as the reason a runtime on the host does not count).", "",
              "## Weights and KV cache by SM", "", MARKS + ".", ""]
    kvs = [None, *(k for k, f in quantformats.KV_FORMATS.items() if f.hf_export)]
    header = ["runtime", "version", "weights", "KV cache", *sms]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in serving.RUNTIME_INFO.items():
        for version in r.versions:
            for quant in (None, *quantformats.FORMATS):
                for kv in kvs:
                    if quant is None and kv is not None:
                        continue
                    marks = [_mark(serving.support(name, quant, kv, sm, version)) for sm in sms]
                    lines.append("| " + " | ".join([r.label, version, quant or "unquantized", kv or "-", *marks]) + " |")
    lines += ["", "A KV-cache-only export (a KV cache format without quantized weights) is claimed by no runtime.", "",
              "## Weight formats, cell by cell", ""]
    for row in t.weights:
        lines += _row_text(row, "quant")
    lines += ["", "## KV cache formats, cell by cell", "", "(for a checkpoint whose weights are quantized)", ""]
    for row in t.kv_cache:
        lines += _row_text(row, "kv_cache")
    lines += ["", "## What each ModelOpt loader accepts", ""]
    for row in t.loaders:
        known = f" (it also parses {', '.join(row.known_algos)}, with no loader)" if row.known_algos else ""
        lines.append(f"- {serving.RUNTIME_INFO[row.runtime].title} {', '.join(row.versions)}: quant_algo "
                     f"{', '.join(row.quant_algos)}{known}; kv_cache_quant_algo {', '.join(row.kv_cache_quant_algos)}. "
                     f"Read: {row.read}. Sources: {', '.join(row.cite)}.")
    lines += ["", "## Sources", ""]
    lines += [_source_line(sid, src) for sid, src in t.sources.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
