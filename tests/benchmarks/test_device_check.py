"""The device check's reduced form (`--cpu_smoke`, what runs with no accelerator): every check
passes and the JSON carries the device, versions, commit and figures a GPU run reports."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from experiments.benchmarks import device_check


@pytest.mark.slow  # ~40 s on the 2-core machine: the micro trainer's generate and learn compiles
def test_cpu_smoke_passes_every_check_and_writes_the_json(tmp_path, capsys):
    out = tmp_path / "device_check.json"
    result = device_check.main(["--cpu_smoke", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["mode"] == "cpu_smoke" and saved["all_passed"] is True
    assert saved["device"]["platform"] == "cpu" and saved["device"]["kind"]
    assert saved["versions"]["jax"] == jax.__version__
    assert len(saved["provenance"]["commit"].split("+")[0]) == 40
    names = [c["name"] for c in saved["checks"]]
    assert names == ["logprobs pallas vs reference", "attention cudnn call run by XLA (padding, lengths) vs reference",
                     "training: finite metrics and params", "training: PIPO count grows to K",
                     "training: PIPO window holds the batch means",
                     "training: float32 masters and AdamW state (bf16 compute)"]
    assert all(c["passed"] for c in saved["checks"]), [c for c in saved["checks"] if not c["passed"]]
    kernels = {c["name"].split()[0]: c for c in saved["checks"][:2]}
    # The Triton kernel's code, interpreted; cuDNN's padding at an odd length (23 -> 64).
    assert kernels["logprobs"]["kernel"] == "pallas/triton (interpret)"
    assert kernels["attention"]["padded_length"] == 64 and kernels["attention"]["shape"][1] == 23
    assert kernels["attention"]["padding_rows_zero"] is True
    for c in kernels.values():  # compared, not vacuous: bf16 rounding shows, within tolerance
        assert 0 < c["max_rel_err"] <= c["tolerance"] == device_check.BF16_REL_TOL
    train = saved["train"]
    assert train["iterations"] == 3 and train["window"] == 2
    counts = next(c for c in saved["checks"] if c["name"] == "training: PIPO count grows to K")["counts"]
    assert counts == [1, 2, 2]
    window = next(c for c in saved["checks"] if c["name"] == "training: PIPO window holds the batch means")
    np.testing.assert_allclose(window["window"], window["mu_t"][-2:], rtol=1e-6)
    losses = saved["checks"][2]["losses"]
    assert len(losses["train/loss"]) == 3 and np.all(np.isfinite(losses["train/loss"]))
    step = train["learner_step"]
    assert step["seconds"] > 0 and step["flops"] > 0 and step["bytes"] > 0 and step["unknown_trip_counts"] == 0
    assert step["flops_per_s"] == pytest.approx(step["flops"] / step["seconds"])
    assert [r["batch"] for r in saved["decode"]] == [1, 8]
    for r in saved["decode"]:
        assert r["generated"] == r["batch"] * r["new_tokens"] and r["tokens_per_s"] > 0
    sweep = saved["sweep"]  # (d): one member, then the group batched and one after another
    assert sweep["preset"] == "micro"
    assert [(r["members"], r["group"]) for r in sweep["rows"]] == [("vmap", 1), ("vmap", 2), ("map", 2)]
    assert all(r["seconds"] > 0 and r["compile_s"] > 0 for r in sweep["rows"])
    assert [r["vs_one_member"] for r in sweep["rows"]] == pytest.approx(
        [r["seconds"] / sweep["rows"][0]["seconds"] for r in sweep["rows"]])
    assert result["out"] == str(out)
    printed = capsys.readouterr().out
    assert "all checks passed: True" in printed and "tokens/s" in printed
    assert "sweep group (micro preset, one RL iteration): 1 member vmap " in printed
