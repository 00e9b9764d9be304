"""How much device memory a compiled program needs, and which of XLA's figures says so.

    PYTHONPATH=<libtpu> python -m experiments.benchmarks.memory_accounting   # table + JSON

XLA reports a compiled program's arguments, outputs, temporaries and aliased (donated) bytes
(`memory_analysis()`); the readiness report's bound is arguments + outputs + temporaries - aliased.
The compiler's buffer assignment is the layout the runtime allocates: one heap per memory space,
whose total for the default space (HBM on an accelerator) XLA writes to its memory-usage report.
On XLA:TPU a donated argument breaks the bound: `temp_size_in_bytes` then grows by more than the
buffer assignment's temporaries (a gradient step on a donated 64 MiB weight: the bound 260.2 MiB,
the buffer assignment 218.6 MiB, as without donation 218.1 MiB), so the bound counts
memory no allocation holds. `compile_accounted` therefore reads the buffer assignment's total on
TPU (`peak_basis` "buffer assignment") and keeps the bound elsewhere (XLA:CPU's assignment equals
the bound on the programs measured here; GPU programs are not compiled on a CPU host).

Run as a script it compiles small programs, with and without donation, for the host and (with
`libtpu`) deviceless for TPU v5p, and writes every figure to
`experiments/results/memory_accounting.json` with commit, versions and machine.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import re
import tempfile

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from pipo_jax import provenance
from pipo_jax.run import atomic

MIB = 2 ** 20
RESULTS = os.path.join(os.path.dirname(__file__), "..", "results", "memory_accounting.json")
# Platforms whose rows hold the buffer assignment's total (see the module docstring).
ASSIGNMENT_PLATFORMS = ("tpu",)
_TOTAL = re.compile(r"Memory Space: default \(color=0\)\s*\nTotal bytes: (\d+)")


def report_total_bytes(report: str) -> int | None:
    """The default memory space's total in an XLA memory-usage report (None if it names none)."""
    m = _TOTAL.search(report)
    return int(m.group(1)) if m else None


def assigned_bytes(dump_dir: str) -> int | None:
    """The buffer assignment's default-space total of the one program compiled into `dump_dir`;
    None when XLA wrote no memory-usage report there. Several reports (one compile per dump folder
    is the contract) are an error."""
    reports = sorted(glob.glob(os.path.join(dump_dir, "*memory-usage-report.txt")))
    if len(reports) > 1:
        raise ValueError(f"{dump_dir}: {len(reports)} memory-usage reports; expected one program's")
    if not reports:
        return None
    with open(reports[0]) as f:
        return report_total_bytes(f.read())


def compile_with_assignment(lowered) -> tuple:
    """(compiled, the buffer assignment's default-space bytes or None): compiled with an XLA dump
    into a temporary folder, whose memory-usage report gives the total."""
    with tempfile.TemporaryDirectory(prefix="xla_dump_") as d:
        compiled = lowered.compile(compiler_options={"xla_dump_to": d})
        return compiled, assigned_bytes(d)


def compile_accounted(lowered, platform: str) -> tuple:
    """(compiled, buffer-assignment bytes or None) for a program whose devices are `platform`'s:
    the total is read on `ASSIGNMENT_PLATFORMS` only (elsewhere the bound is held), and a program
    without one there is an error, never a silent fall back to the bound."""
    if platform not in ASSIGNMENT_PLATFORMS:
        return lowered.compile(), None
    compiled, assigned = compile_with_assignment(lowered)
    if assigned is None:
        raise RuntimeError(f"XLA wrote no memory-usage report for this {platform} program (loaded from a "
                           "persistent compilation cache?); run with jax_enable_compilation_cache=False")
    return compiled, assigned


def memory_row(compiled, assigned: int | None = None) -> dict:
    """Per-device bytes of a compiled program. `peak_bytes` is the figure held to a memory limit:
    the buffer assignment's total (`assigned`) when given, else the bound arguments + outputs +
    temporaries - aliased (`bound_bytes`); `peak_basis` says which. `xla_peak_bytes` is XLA's own
    `peak_memory_in_bytes` (on XLA:CPU it leaves buffers out)."""
    m = compiled.memory_analysis()
    row = {"argument_bytes": m.argument_size_in_bytes, "output_bytes": m.output_size_in_bytes,
           "temp_bytes": m.temp_size_in_bytes, "alias_bytes": m.alias_size_in_bytes,
           "xla_peak_bytes": int(getattr(m, "peak_memory_in_bytes", 0) or 0)}
    row["bound_bytes"] = row["argument_bytes"] + row["output_bytes"] + row["temp_bytes"] - row["alias_bytes"]
    if assigned is not None:
        row.update(assigned_bytes=assigned, peak_bytes=assigned, peak_basis="buffer assignment")
    else:
        row.update(peak_bytes=row["bound_bytes"], peak_basis="bound")
    return row


# ----------------------------------------------------------------------------- the demonstration

def scan_grad_step(w, xs):
    """One gradient step of a 16-step tanh recurrence: w f32[4096, 4096] (64 MiB), xs f32[16, 64, 4096]."""
    def loss(w):
        def body(h, x):
            return jnp.tanh(h @ w + x), None
        h, _ = jax.lax.scan(body, jnp.zeros((xs.shape[1], w.shape[0]), w.dtype), xs)
        return h.sum()
    return w - 0.1 * jax.grad(loss)(w)


def scaled(x):
    """x * 2 over 256 MiB: no temporaries; donated, the output takes the argument's buffer."""
    return x * 2.0


PROGRAMS = {"scan_grad_step": (scan_grad_step, ((4096, 4096), (16, 64, 4096))),
            "scaled": (scaled, ((64 * MIB,),))}


def measure(devices, name: str, donate: bool) -> dict:
    """The program compiled for `devices[0]`'s platform with a dump: every figure side by side."""
    fn, shapes = PROGRAMS[name]
    sharding = jax.sharding.SingleDeviceSharding(devices[0])
    args = [jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for s in shapes]
    compiled, assigned = compile_with_assignment(jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(*args))
    row = memory_row(compiled, assigned)
    return {"program": name, "donated": donate, "platform": devices[0].platform, **row}


def first_line(e: Exception) -> str:
    """`e` as one line: its type and the first non-empty line of its message, at most 300 characters
    (XLA's and libtpu's errors run long)."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


def tpu_devices() -> tuple[list, str]:
    try:
        return list(topologies.get_topology_desc("v5p:2x2x1", "tpu").devices), ""
    except Exception as e:  # noqa: BLE001 (reported: no libtpu here)
        return [], first_line(e)


def libtpu_version() -> str:
    try:
        return "libtpu " + importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return "libtpu (version unknown)"


def format_rows(rows: list[dict]) -> str:
    head = ("| platform | program | donated | args MiB | outputs MiB | temps MiB | aliased MiB | bound MiB | "
            "buffer assignment MiB | XLA peak MiB |")
    lines = [head, "|" + "---|" * 3 + "---:|" * 7]
    for r in rows:
        lines.append(f"| {r['platform']} | {r['program']} | {'yes' if r['donated'] else 'no'} | "
                     + " | ".join(f"{r[k] / MIB:.1f}" for k in ("argument_bytes", "output_bytes", "temp_bytes",
                                                                  "alias_bytes", "bound_bytes", "assigned_bytes",
                                                                  "xla_peak_bytes")) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    jax.config.update("jax_enable_compilation_cache", False)  # a cached program writes no buffer assignment
    tpu, why_not = tpu_devices()
    rows = [measure(devices, name, donate) for devices in (jax.devices("cpu"), tpu) if devices
            for name in PROGRAMS for donate in (False, True)]
    result = {"script": "experiments.benchmarks.memory_accounting", **provenance.record(),
              "libtpu": f"{libtpu_version()}, v5p:2x2x1 (deviceless)" if tpu else f"not available: {why_not}",
              "rows": rows}
    print(format_rows(rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    atomic.write_json_atomic(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
