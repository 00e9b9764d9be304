"""The readiness report's tables as Markdown, from its JSON (`experiments/benchmarks/readiness.py`
writes it). Imports no jax: the docs render it (`python -m experiments.reproduce readiness_8b`)."""

from __future__ import annotations

GB = 1e9
PLATFORMS = ("tpu", "cuda")
SMALL_MESHES = ((1, 8, 1), (1, 4, 2), (2, 2, 2))
# What a row's peak counts (`memory_accounting.memory_row`'s `peak_basis`); rows of reports made
# before the basis was recorded hold the bound.
BASIS_LABELS = {"bound": "bound", "buffer assignment": "assigned"}


def basis(row: dict) -> str:
    return BASIS_LABELS[row.get("peak_basis", "bound")]


def roofline_kinds(rows: list[dict]) -> list[str]:
    """The device kinds any row gives a roofline for, in the order the rows give them (a host row
    gives every kind, a TPU row the TPU's)."""
    return list(dict.fromkeys(k for r in rows for k in r.get("roofline_s", {})))


def short_kind(kind: str) -> str:
    return kind.replace("TPU ", "")


def lower_bound(row: dict) -> str:
    """'>= ' where the counted FLOPs fall short: a loop counted once, or kernels whose FLOPs the
    program does not show."""
    return ">= " if row.get("unknown_trip_counts") or row.get("opaque_kernels") else ""


def summary_counts(result: dict) -> dict[str, int]:
    """PASS / FAIL / SKIP over every row of the report: lowering, each program's memory, the trainer's
    programs with the state resident, the checks."""
    paper = result.get("paper", {})
    rows = result.get("lowering", []) + paper.get("memory", []) + paper.get("trainer", []) + paper.get("checks", [])
    return {s: sum(r["status"] == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}


def markdown(result: dict) -> str:
    """The report's tables as Markdown: lowering, per-program memory and roofline, the trainer's
    programs with the state resident, the checks."""
    lines = []
    if result.get("lowering"):
        meshes = sorted({r["mesh"] for r in result["lowering"]}, key=lambda m: SMALL_MESHES.index(
            tuple(int(x) for x in m.split("x"))))
        lines += ["| entry point | " + " | ".join(meshes) + " |", "|---|" + "---|" * len(meshes)]
        by = {(r["entry_point"], r["mesh"]): r for r in result["lowering"]}
        for name in dict.fromkeys(r["entry_point"] for r in result["lowering"]):
            cells = []
            for m in meshes:
                r = by.get((name, m))
                if r is None:
                    cells.append("")
                    continue
                marks = [f"{p} {'ok' if r['export'][p]['ok'] else 'FAIL'}" for p in PLATFORMS]
                tc = r["tpu_compile"].get("ok")
                marks.append("v5p " + ("skip" if tc is None else "ok" if tc else "FAIL"))
                cells.append(", ".join(marks))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    paper = result.get("paper", {})
    if paper.get("memory"):
        kinds = roofline_kinds(paper["memory"])
        lines += ["| model | program | target | peak GB/device | counted as | XLA temp GB | limit | status | "
                  + " / ".join(map(short_kind, kinds)) + " roofline s |", "|---|---|---|---:|---|---:|---:|---|---|"]
        for r in paper["memory"]:
            if not r["ok"]:
                if "temp_bytes_at_least" in r:
                    lines.append(f"| {r['model']} | {r['program']} | {r['target']} | | | >= "
                                 f"{r['temp_bytes_at_least'] / GB:.0f} | {r['limit_gb']:.0f} | {r['status']}: "
                                 "exceeds the chip's HBM (compiler) | |")
                    continue
                lines.append(f"| {r['model']} | {r['program']} | {r['target']} | | | | {r['limit_gb']:.0f} | "
                             f"{r['status']}: {r['error'][:90]} | |")
                continue
            roof = ""
            if "roofline_s" in r:
                roof = lower_bound(r) + " / ".join(f"{r['roofline_s'][k]:.0f}" if k in r["roofline_s"] else "-"
                                                   for k in kinds)
            lines.append(f"| {r['model']} | {r['program']} | {r['target']} | {r['peak_bytes'] / GB:.1f} | "
                         f"{basis(r)} | {r['temp_bytes'] / GB:.1f} | {r['limit_gb']:.0f} | {r['status']} | {roof} |")
        lines.append("")
    if paper.get("trainer"):
        lines += trainer_table(paper["trainer"]) + [""]
        terms = byte_terms_table(paper["trainer"])
        lines += terms + [""] if terms else []
    if paper.get("decode_weights"):
        lines += decode_weights_table(paper["decode_weights"]) + [""]
    if paper.get("checks"):
        lines += ["| model | check | value | limit | status |", "|---|---|---:|---:|---|"]
        for c in paper["checks"]:
            v = "n/a" if c["value"] is None else f"{c['value']:.2f}"
            lines.append(f"| {c['model']} | {c['check']} | {v} | {c['limit']} | {c['status']} |")
    return "\n".join(lines)


def trainer_table(rows: list[dict]) -> list[str]:
    """The trainer's programs as it runs them (`learn`: the whole update; `generate_resident`: generate
    beside the state it does not take): peak alone, peak with the training state resident, the
    project's limit, the margin to the chip's HBM, arithmetic intensity and per device kind the
    bound and the MFU at that bound (a TPU row for the TPU, a host row for every kind)."""
    kinds = roofline_kinds(rows)
    lines = ["| model | program | target | peak GB/device | counted as | state resident GB | limit | status | "
             "HBM margin GB | FLOP/B | " + " | ".join(f"{k}: bound, MFU <=" for k in kinds) + " |",
             "|---|---|---|---:|---|---:|---:|---|---:|---:|" + "---|" * len(kinds)]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['model']} | {r['program']} | {r['target']} | | | | {r['limit_gb']:.0f} | "
                         f"{r['status']}: {r['error'][:90]} | | |" + " |" * len(kinds))
            continue
        margin = f"{r['margin_gb']:.1f} of {r['device_memory_gb']:.0f}" if "margin_gb" in r else ""
        at_least = ">= " if r.get("opaque_kernels") else ""  # kernels' FLOPs not counted, their bytes are
        intensity = f"{at_least}{r['arithmetic_intensity']:.0f}" if "arithmetic_intensity" in r else ""
        bounds = [f"{r['bound'][k]}, {100 * r['mfu_at_roofline'][k]:.0f}%" if k in r.get("bound", {}) else ""
                  for k in kinds]
        lines.append(f"| {r['model']} | {r['program']} | {r['target']} | {r['peak_bytes'] / GB:.1f} | {basis(r)} | "
                     f"{r['resident_peak_bytes'] / GB:.1f} | {r['limit_gb']:.0f} | {r['status']} | {margin} | "
                     f"{intensity} | " + " | ".join(bounds) + " |")
    return lines


BYTE_TERMS_SHOWN = 3


def op_label(source: str, width: int = 90) -> str:
    """A JAX op_name path shortened to `width` characters around an ellipsis: its head says which step
    (the PI step runs under `cond`), its tail which op."""
    if len(source) <= width:
        return source or "-"
    half = (width - 3) // 2
    return f"{source[:half]} … {source[-half:]}"


def byte_terms_table(rows: list[dict]) -> list[str]:
    """The largest byte terms of each trainer program: the source op (HLO op and its JAX op_name,
    loops' trip counts multiplied in) and its share of the program's bytes."""
    lines = []
    for r in rows:
        for label, nbytes in r.get("largest_byte_terms", [])[:BYTE_TERMS_SHOWN]:
            op, _, source = label.partition(" ")
            lines.append(f"| {r['model']} | {r['program']} | {r['target']} | {op} | `{op_label(source)}` | "
                         f"{nbytes / GB:,.0f} | {100 * nbytes / r['bytes_per_device']:.0f}% |")
    if not lines:
        return []
    return ["| model | program | target | HLO op | JAX op | GB/device | share of bytes |",
            "|---|---|---|---|---|---:|---:|"] + lines


def decode_weights_table(rows: list[dict]) -> list[str]:
    """Generate with the training state resident, per `rollout.decode_weights` layout: memory, the bytes a
    decode step all-gathers (the decode loops' one step each, over the generation passes), the counted FLOPs
    and bytes (the decode loops counted once), and which layout `auto` picks for the target."""
    lines = ["| model | target | decode_weights | peak GB/device | state resident GB | limit | fits | "
             "all-gathered per decode step GB | counted TFLOP/device | counted TB/device |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        name = r["decode_weights"] + (" (auto)" if r.get("auto") else "")
        if not r["ok"]:
            lines.append(f"| {r['model']} | {r['target']} | {name} | | | {r['limit_gb']:.0f} | "
                         f"{r['error'][:90]} | | | |")
            continue
        fits = "yes" if r["resident_peak_bytes"] <= r["limit_gb"] * GB else "no"
        lines.append(f"| {r['model']} | {r['target']} | {name} | {r['peak_bytes'] / GB:.1f} | "
                     f"{r['resident_peak_bytes'] / GB:.1f} | {r['limit_gb']:.0f} | {fits} | "
                     f"{r['all_gather_bytes_decode_loops'] / r['decode_passes'] / GB:.2f} | "
                     f">= {r['flops_per_device'] / 1e12:,.0f} | "
                     f">= {r['bytes_per_device'] / 1e12:,.1f} |")
    return lines
