"""experiments/benchmarks/readiness_tables.py: the report's counts and its trainer-program table."""

from experiments.benchmarks import readiness_tables as tables

GB = tables.GB


def trainer_row(status, resident_gb, **extra):
    return {"model": "qwen3_8b", "program": "learn", "target": "v5p-16 fsdp=8", "ok": True, "status": status,
            "peak_bytes": 40 * GB, "resident_peak_bytes": resident_gb * GB, "limit_gb": 48.0, **extra}


def test_the_summary_counts_the_trainer_programs_too():
    result = {"lowering": [{"status": "PASS"}], "paper": {
        "memory": [{"status": "PASS"}, {"status": "FAIL"}], "checks": [{"status": "SKIP"}],
        "trainer": [trainer_row("FAIL", 48.3), trainer_row("PASS", 28.6)]}}
    assert tables.summary_counts(result) == {"PASS": 3, "FAIL": 2, "SKIP": 1}


def test_a_trainer_row_shows_the_resident_peak_the_margin_and_the_bound_per_device_kind():
    tpu = trainer_row("FAIL", 48.33, margin_gb=47.41, device_memory_gb=95.74, peak_basis="buffer assignment")
    host = trainer_row("PASS", 41.88, arithmetic_intensity=70.2, roofline_s={"H20": 677.1, "H100": 427.2},
                       bound={"H20": "compute", "H100": "memory"}, mfu_at_roofline={"H20": 1.0, "H100": 0.243})
    lines = tables.trainer_table([tpu, host])
    assert lines[0].endswith("| FLOP/B | H20: bound, MFU <= | H100: bound, MFU <= |")
    assert lines[2] == ("| qwen3_8b | learn | v5p-16 fsdp=8 | 40.0 | assigned | 48.3 | 48 | FAIL | 47.4 of 96 "
                        "|  |  |  |")
    # A row of a report made before the basis was recorded held the bound.
    assert lines[3] == ("| qwen3_8b | learn | v5p-16 fsdp=8 | 40.0 | bound | 41.9 | 48 | PASS |  | 70 | compute, 100% "
                        "| memory, 24% |")
    assert "| qwen3_8b | learn | v5p-16 fsdp=8 | 40.0 | assigned | 48.3 |" in tables.markdown(
        {"paper": {"trainer": [tpu]}})


def test_a_tpu_row_gives_the_tpu_roofline_and_the_largest_byte_terms():
    """A TPU program's roofline is the TPU's only; its FLOPs leave out the kernels' (splash attention),
    so its intensity is a lower bound; the whole update's largest byte terms get a table."""
    host = trainer_row("PASS", 41.88, target="host fsdp=8", arithmetic_intensity=70.2,
                       roofline_s={"H20": 677.1, "TPU v5p": 218.0}, bound={"H20": "compute", "TPU v5p": "memory"},
                       mfu_at_roofline={"H20": 1.0, "TPU v5p": 0.42})
    tpu = trainer_row("PASS", 35.2, margin_gb=60.6, device_memory_gb=95.74, peak_basis="buffer assignment",
                      arithmetic_intensity=242.6, roofline_s={"TPU v5p": 183.4}, bound={"TPU v5p": "compute"},
                      mfu_at_roofline={"TPU v5p": 1.0}, opaque_kernels=16, bytes_per_device=347e12,
                      largest_byte_terms=[["fusion jit(step)/while/body/dot_general", 25.8e12], ["custom-call", 13e12]])
    lines = tables.trainer_table([host, tpu])
    assert lines[0].endswith("| FLOP/B | H20: bound, MFU <= | TPU v5p: bound, MFU <= |")
    assert lines[3].endswith("| 60.6 of 96 | >= 243 |  | compute, 100% |")
    assert tables.byte_terms_table([host, tpu]) == [
        "| model | program | target | HLO op | JAX op | GB/device | share of bytes |",
        "|---|---|---|---|---|---:|---:|",
        "| qwen3_8b | learn | v5p-16 fsdp=8 | fusion | `jit(step)/while/body/dot_general` | 25,800 | 7% |",
        "| qwen3_8b | learn | v5p-16 fsdp=8 | custom-call | `-` | 13,000 | 4% |"]
    long = "jit(step)/cond/branch_1_fun/" + "while/body/" * 10 + "checkpoint/bti,im->btm/dot_general"
    assert tables.op_label(long) == f"{long[:43]} … {long[-43:]}" and len(tables.op_label(long)) == 89
    memory = [dict(host, program="pi_step", peak_bytes=67 * GB, temp_bytes=55 * GB, peak_basis="bound"),
              dict(tpu, program="pi_step", peak_bytes=33 * GB, temp_bytes=34 * GB)]
    text = tables.markdown({"paper": {"memory": memory}})
    assert "| status | H20 / v5p roofline s |" in text
    assert text.splitlines()[-1].endswith("| PASS | >= - / 183 |")


def test_the_decode_weights_table_marks_the_auto_layout_and_whether_it_fits():
    def row(layout, auto, peak_gb, resident_gb, gathers_gb):
        return {"model": "qwen3_8b", "target": "gpu fsdp=8", "decode_weights": layout, "auto": auto, "ok": True,
                "peak_bytes": peak_gb * GB, "resident_peak_bytes": resident_gb * GB, "limit_gb": 48.0,
                "all_gather_bytes_decode_loops": 16 * gathers_gb * GB, "decode_passes": 16, "flops_per_device": 939e12,
                "bytes_per_device": 112.3e12}

    gathered, sharded = row("gathered", False, 53.14, 63.39, 0.01), row("sharded", True, 31.6, 41.9, 15)
    lines = tables.decode_weights_table([gathered, sharded])
    assert lines[2] == "| qwen3_8b | gpu fsdp=8 | gathered | 53.1 | 63.4 | 48 | no | 0.01 | >= 939 | >= 112.3 |"
    assert lines[3] == "| qwen3_8b | gpu fsdp=8 | sharded (auto) | 31.6 | 41.9 | 48 | yes | 15.00 | >= 939 | >= 112.3 |"
    assert "| sharded (auto) |" in tables.markdown({"paper": {"decode_weights": [sharded]}})
