"""The readiness report's pieces: HLO cost counting (hand-counted FLOPs), model FLOPs, and the
small-shape lowering of entry points on simulated 8-device meshes for `tpu` and `cuda`.

The lowering runs `python -m experiments.benchmarks.readiness` in a subprocess (the 8
simulated devices need XLA_FLAGS before jax starts); with libtpu installed
(`pip install -e ".[readiness]"`) its TPU programs are compiled for a v5p slice too,
without it those cells are SKIP and the TPU-compile test skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from experiments.benchmarks import hlo_cost, readiness
from experiments.benchmarks.readiness import custom_calls, hbm_exceeded_bytes, model_train_flops, paper_spec, roofline
from pipo_jax.models import qwen3
from tests.typed import spec_of
from tests.xla_flags import xla_flags

REPO = Path(__file__).resolve().parents[2]
HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None


def _layers(w_ldd, x_nd):
    return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x_nd, w_ldd)[0].sum()


W = jax.ShapeDtypeStruct((10, 64, 64), jnp.float32)
X = jax.ShapeDtypeStruct((32, 64), jnp.float32)
LAYER_FLOPS = 2 * 32 * 64 * 64  # one [32, 64] x [64, 64] matmul


def test_hlo_cost_counts_every_loop_trip():
    compiled = jax.jit(_layers).lower(W, X).compile()
    cost = hlo_cost.program_cost(compiled.as_text())
    assert cost.flops == 10 * LAYER_FLOPS
    assert cost.unknown_trip_counts == 0
    # XLA's own count sees the loop body once: the reason hlo_cost exists.
    assert compiled.cost_analysis()["flops"] < 2 * LAYER_FLOPS


def test_hlo_cost_backward_is_three_matmuls_per_layer():
    compiled = jax.jit(jax.grad(_layers)).lower(W, X).compile()
    # forward x @ w, backward dx = g @ w.T and dw = x.T @ g: 3 matmuls of the same size per layer.
    assert hlo_cost.program_cost(compiled.as_text()).flops == 30 * LAYER_FLOPS


def test_hlo_cost_conditional_takes_the_costlier_branch_and_flags_unknown_trips():
    def f(p, x_nd, w_dd):
        y = jax.lax.cond(p, lambda: (x_nd @ w_dd) @ w_dd, lambda: x_nd)
        # a data-dependent exit: no known trip count, counted once and flagged
        return jax.lax.while_loop(lambda c: jnp.sum(c) < 1e9, lambda c: c @ w_dd + 1.0, y)

    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    cost = hlo_cost.program_cost(jax.jit(f).lower(jax.ShapeDtypeStruct((), bool), X, w).compile().as_text())
    assert cost.flops == 3 * LAYER_FLOPS
    assert cost.unknown_trip_counts == 1


def _without_known_trip_counts(hlo_text: str) -> str:
    """The HLO as XLA:TPU writes it: no `known_trip_count` on any loop."""
    stripped = re.sub(r'"known_trip_count":\{"n":"\d+"\},?', "", hlo_text)
    assert "known_trip_count" not in stripped
    return stripped


def test_hlo_cost_reads_a_counted_loop_where_xla_leaves_its_trip_count_out():
    """XLA:TPU writes no `known_trip_count`; the counted-loop pattern gives the same counts: a
    counter from 3 in steps of 2 below 17 (7 trips), scans in scans, their gradient, and the micro
    trainer's whole update and generate (the loops XLA:CPU outlines into called computations too)."""
    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)

    def stepped(x, w_dd):
        return jax.lax.while_loop(lambda c: c[0] < 17, lambda c: (c[0] + 2, jnp.tanh(c[1] @ w_dd)), (3, x))[1]

    def nested(x, w_dd):
        inner = lambda c, _: jax.lax.scan(lambda h, _: (jnp.tanh(h @ w_dd), None), c, None, length=4)[0]  # noqa: E731
        return jax.lax.scan(lambda c, _: (inner(c, None), None), x, None, length=3)[0]

    expected = {stepped: 7 * LAYER_FLOPS, nested: 12 * LAYER_FLOPS,
                jax.grad(lambda x, w_dd: nested(x, w_dd).sum(), argnums=1): 36 * LAYER_FLOPS}
    for f, flops in expected.items():
        text = jax.jit(f).lower(X, w).compile().as_text()
        counted = hlo_cost.program_cost(_without_known_trip_counts(text))
        assert counted == hlo_cost.program_cost(text)
        assert counted.flops == flops and counted.unknown_trip_counts == 0
    spec, mesh = readiness.small_spec("grpo", True), readiness.host_mesh((1, 1, 1))
    for name, data_dependent in (("learn", 0), ("generate_resident", 2)):  # decoding's early exits
        text = readiness.trainer_programs(spec, mesh)[name][0]().lower().compile().as_text()
        counted = hlo_cost.program_cost(_without_known_trip_counts(text))
        assert counted == hlo_cost.program_cost(text) and counted.unknown_trip_counts == data_dependent


def test_hlo_cost_counts_a_padded_convolution_by_the_taps_that_land_on_input():
    """2 x batch x in x out features x valid (output, tap) pairs: a width-3 window padded by 1 over 10
    inputs has 28 valid pairs (30 less the two on padding); stride 2, dilation 2, padding 2: 13 of 15."""
    x, w = jax.ShapeDtypeStruct((2, 4, 10), jnp.float32), jax.ShapeDtypeStruct((5, 4, 3), jnp.float32)
    same = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1,), [(1, 1)])).lower(x, w).compile()
    assert hlo_cost.program_cost(same.as_text()).flops == 2 * 2 * 4 * 5 * 28
    strided = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (2,), [(2, 2)], rhs_dilation=(2,)))
    taps = sum(0 <= o * 2 + k * 2 - 2 < 10 for o in range(5) for k in range(3))
    assert taps == 13 and hlo_cost.program_cost(strided.lower(x, w).compile().as_text()).flops == 2 * 2 * 4 * 5 * 13


PREFETCH_HLO = """HloModule m

ENTRY %main (p: f32[256]) -> f32[256] {
  %p = f32[256]{0} parameter(0)
  %copy-start = (f32[256]{0:S(1)}, f32[256]{0}, u32[]{:S(2)}) copy-start(%p)
  %copy-done = f32[256]{0:S(1)} copy-done(%copy-start)
  ROOT %negate = f32[256]{0} negate(%copy-done)
}
"""


def test_hlo_cost_does_not_charge_a_prefetch_to_on_chip_memory():
    """XLA:TPU's copy-start / copy-done into memory space S(1) stage a value for the op that reads it,
    which is charged its operand and result (1 KiB each): counting the copies too would charge it thrice."""
    assert hlo_cost.program_cost(PREFETCH_HLO).bytes == 2 * 256 * 4
    assert hlo_cost.byte_terms(*hlo_cost.parse(PREFETCH_HLO)) == {"negate": 2 * 256 * 4}


CACHE_WRITE_HLO = """HloModule m

%write (cache: bf16[4,1024,128], rows: s32[8,2], kv: bf16[8,128]) -> bf16[4,1024,128] {
  %cache = bf16[4,1024,128]{2,1,0} parameter(0)
  %rows = s32[8,2]{1,0} parameter(1)
  %kv = bf16[8,128]{1,0} parameter(2)
  ROOT %scatter = bf16[4,1024,128]{2,1,0} scatter(%cache, %rows, %kv), update_window_dims={1}
}

ENTRY %main (c: bf16[4,1024,128], i: s32[8,2], u: bf16[8,128], x: f32[1024]) -> (bf16[4,1024,128], f32[1024]) {
  %c = bf16[4,1024,128]{2,1,0} parameter(0)
  %i = s32[8,2]{1,0} parameter(1)
  %u = bf16[8,128]{1,0} parameter(2)
  %x = f32[1024]{0} parameter(3)
  %written = bf16[4,1024,128]{2,1,0} fusion(%c, %i, %u), kind=kCustom, calls=%write
  %permute-start = (f32[1024]{0}, f32[1024]{0}) collective-permute-start(%x), source_target_pairs={{0,1},{1,0}}
  %permute-done = f32[1024]{0} collective-permute-done(%permute-start)
  ROOT %out = (bf16[4,1024,128]{2,1,0}, f32[1024]{0}) tuple(%written, %permute-done)
}
"""


NESTED_SLICE_HLO = """HloModule m

%take (stack: bf16[36,64,256], i: s32[]) -> bf16[64,256] {
  %stack = bf16[36,64,256]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %zero = s32[] constant(0)
  %layer = bf16[1,64,256]{2,1,0} dynamic-slice(%stack, %i, %zero, %zero), dynamic_slice_sizes={1,64,256}
  ROOT %w = bf16[64,256]{1,0} bitcast(%layer)
}

%matmul (stack.1: bf16[36,64,256], i.1: s32[], x: bf16[8,64]) -> bf16[8,256] {
  %stack.1 = bf16[36,64,256]{2,1,0} parameter(0)
  %i.1 = s32[] parameter(1)
  %x = bf16[8,64]{1,0} parameter(2)
  %w.1 = bf16[64,256]{1,0} fusion(%stack.1, %i.1), kind=kLoop, calls=%take
  ROOT %y = bf16[8,256]{1,0} dot(%x, %w.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (s: bf16[36,64,256], n: s32[], a: bf16[8,64]) -> bf16[8,256] {
  %s = bf16[36,64,256]{2,1,0} parameter(0)
  %n = s32[] parameter(1)
  %a = bf16[8,64]{1,0} parameter(2)
  ROOT %out = bf16[8,256]{1,0} fusion(%s, %n, %a), kind=kOutput, calls=%matmul
}
"""


def test_hlo_cost_charges_a_layer_sliced_inside_a_nested_fusion_not_the_stack():
    """XLA:TPU fuses a layer's slice of stacked weights into the matmul's fusion, one fusion deeper: the
    matmul reads one [64, 256] layer (32 KiB), not the 36-layer stack (1.1 MiB)."""
    layer, x, y = 64 * 256 * 2, 8 * 64 * 2, 8 * 256 * 2
    assert hlo_cost.program_cost(NESTED_SLICE_HLO).bytes == layer + 4 + x + y


def test_hlo_cost_charges_a_cache_write_its_rows_and_a_collective_once():
    """A KV cache written in place by a scatter fusion (XLA:TPU's decode step) moves the 8 rows it
    writes (2 KiB, read and written) and their indices, not the 1 MiB cache twice over; an asynchronous
    collective-permute is charged at its start (4 KiB sent, 4 KiB received), its done moves nothing more."""
    assert hlo_cost.byte_terms(*hlo_cost.parse(CACHE_WRITE_HLO)) == {"fusion": 64 + 2 * 8 * 128 * 2, "collective-permute-start": 8192}
    assert hlo_cost.program_cost(CACHE_WRITE_HLO).bytes == 64 + 4096 + 8192


@pytest.mark.skipif(not HAVE_LIBTPU, reason="libtpu not installed (pip install -e \".[readiness]\")")
def test_a_tpu_trainer_program_is_counted_from_its_own_hlo():
    """The micro update as XLA:TPU builds it for v5p-8: every loop's trip count read from the loop,
    splash attention's kernels counted as bytes only, the roofline for the TPU alone, the byte terms
    adding up to the program's bytes."""
    r = readiness
    spec = r.for_target(r.small_spec("grpo", True, "bfloat16"), "tpu")
    row = r.trainer_program_row(spec, r.tpu_mesh((1, 4, 1), "v5p-8"), "learn", "TPU v5p", r.TPU_KINDS)
    assert row["ok"] and row["unknown_trip_counts"] == 0 and row["opaque_kernels"] > 0
    assert list(row["roofline_s"]) == list(row["bound"]) == ["TPU v5p"]
    assert row["flops_per_device"] > 0 and row["bytes_per_device"] >= sum(b for _, b in row["largest_byte_terms"])


def test_hlo_cost_charges_a_slice_of_stacked_weights_not_the_stack():
    cost = hlo_cost.program_cost(jax.jit(_layers).lower(W, X).compile().as_text())
    layer = 64 * 64 * 4
    # Each of the 10 steps reads its [64, 64] layer (16 KiB) at least once; XLA:CPU copies the
    # slice out and runs the matmul and tanh as separate ops (~80 KiB a step in all). Charging
    # the whole 160 KiB stack to the slicing op every step alone would be 10 x 160 KiB.
    assert 10 * layer <= cost.bytes < 10 * 10 * layer


def test_model_train_flops_by_hand():
    cfg = qwen3.Qwen3Config(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=4, rope_theta=1e4,
                            max_position_embeddings=64, tie_word_embeddings=True)
    # per layer: qkv 8*4*(2+2) = 128, o 2*4*8 = 64, mlp 3*8*16 = 384 -> 576 params
    rows, prompt, response = 3, 4, 6
    seq = 10
    decoder = 2 * 2 * 576 * rows * seq  # 69,120
    attention = 2 * 2 * 2 * 2 * 4 * (seq * seq / 2) * rows  # 19,200
    head = 2 * 8 * 100 * rows * response  # 28,800
    assert model_train_flops(cfg, rows, prompt, response, remat=False) == 3 * (decoder + attention) + 4 * head
    assert model_train_flops(cfg, rows, prompt, response, remat=True) == 4 * (decoder + attention) + 4 * head


def test_paper_spec_is_table_5():
    spec = paper_spec("qwen3_8b")
    assert (spec.rollout.prompts_per_batch, spec.rollout.group_size, spec.batch) == (128, 8, 1024)
    assert (spec.prompt_len, spec.rollout.max_new_tokens) == (512, 4096)
    assert spec.mini_batch == 64 * 8 and spec.pipo.enabled and spec.algorithm.name == "grpo"
    assert spec.model == qwen3.preset("qwen3_8b", param_dtype=spec.model.param_dtype, dtype=spec.model.dtype,
                                      remat=spec.model.remat)
    assert spec.model.remat == "full" and spec.train.lr == spec.pipo.lr == 1e-6
    small = paper_spec("qwen3_4b", prompts=16, prompt_len=256, response_len=2048)
    assert (small.batch, small.seq_len) == (128, 2304)


def test_roofline_is_the_slower_of_compute_and_memory():
    t = roofline(148e12, 1.0e12)  # 148 TFLOP and 1 TB
    assert t["H20"] == pytest.approx(1.0)  # compute-bound: 148 / 148
    assert t["H100"] == pytest.approx(1.0 / 3.35)  # memory-bound: 1 TB / 3.35 TB/s
    assert t["TPU v5p"] == pytest.approx(1.0 / 2.76)  # memory-bound: 0.362 s > 148 / 459 = 0.322 s


def test_custom_calls_found_in_stablehlo_text():
    text = ('%0 = stablehlo.custom_call @tpu_custom_call(%a) {backend_config = "x"}\n'
            '%1 = stablehlo.custom_call @Sharding(%0)\n%2 = stablehlo.custom_call @cpu_gemv(%1)')
    assert custom_calls(text) == ["cpu_gemv", "tpu_custom_call"]


def test_hbm_exceeded_bytes_reads_the_tpu_compiler_message():
    msg = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (1.28T) "
           "exceeds available HBM (95.74G).")
    assert hbm_exceeded_bytes(msg) == pytest.approx(1.28 * 2**40)
    assert hbm_exceeded_bytes("INVALID_ARGUMENT: something else") is None


def _run_readiness(tmp_path: Path, only: str) -> dict:
    out = tmp_path / "readiness.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env["XLA_FLAGS"] = xla_flags()  # readiness adds its device count
    proc = subprocess.run([sys.executable, "-m", "experiments.benchmarks.readiness", "--parts", "lowering",
                           "--only", only, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


# Today's entry points that must export for both platforms on a tensor-parallel and a 3-axis mesh.
FAST_ROWS = ["^qwen3_forward_grad@1x4x2", "^logprobs_chunked@2x2x2", "^decode_step@2x2x2", "^engine_generate@1x4x2",
             "^iteration_grpo_pipo_bf16@1x4x2"]


@pytest.fixture(scope="module")
def fast_report(tmp_path_factory):
    return _run_readiness(tmp_path_factory.mktemp("readiness"), ",".join(FAST_ROWS))


def test_entry_points_export_for_tpu_and_cuda(fast_report):
    rows = {f"{r['entry_point']}@{r['mesh']}": r for r in fast_report["lowering"]}
    assert sorted(rows) == sorted(r.lstrip("^") for r in FAST_ROWS)
    for name, row in rows.items():
        for plat in ("tpu", "cuda"):
            assert row["export"][plat]["ok"], (name, plat, row["export"][plat])
            assert not any("cpu_gemv" in c or "cpu_attention" in c for c in row["export"][plat]["custom_calls"])


def test_report_records_provenance_and_libtpu(fast_report):
    assert len(fast_report["commit"]) == 40
    assert fast_report["packages"]["jax"] == jax.__version__
    assert fast_report["machine"]["host_devices"] == 8
    assert (fast_report["libtpu"] == "present") == HAVE_LIBTPU
    expected = "PASS" if HAVE_LIBTPU else "SKIP"
    assert [r["status"] for r in fast_report["lowering"]] == [expected] * len(FAST_ROWS)


def test_bf16_iteration_at_an_odd_length_carries_the_fused_attention(fast_report):
    """The micro preset's GRPO + PIPO iteration in the paper presets' compute dtype (bf16) builds
    at its odd length (T = 11) with cuDNN flash attention, forward and backward, on cuda and
    splash (Mosaic) on tpu."""
    row = next(r for r in fast_report["lowering"] if r["entry_point"] == "iteration_grpo_pipo_bf16")
    assert row["export"]["cuda"]["lengths"] == {"policy": 11}
    assert {"__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"} <= set(row["export"]["cuda"]["custom_calls"])
    assert "tpu_custom_call" in row["export"]["tpu"]["custom_calls"]
    assert not row["export"]["cuda"]["problems"] and not row["export"]["tpu"]["problems"]


@pytest.mark.skipif(not HAVE_LIBTPU, reason="libtpu not installed (pip install -e \".[readiness]\")")
def test_tpu_programs_compile_for_v5p(fast_report):
    for row in fast_report["lowering"]:
        assert row["tpu_compile"]["ok"], (row["entry_point"], row["mesh"], row["tpu_compile"])
        assert row["tpu_compile"]["peak_bytes"] > 0


@pytest.mark.slow
def test_generate_and_trainer_iterations_export(tmp_path):
    rows = ["^prefill@1x8x1", "^generate@2x2x2", "^iteration_grpo_pipo@2x2x2", "^iteration_ppo@1x4x2",
            "^iteration_vpd_pipo_bf16@2x2x2"]
    report = _run_readiness(tmp_path, ",".join(rows))
    assert sorted(f"{r['entry_point']}@{r['mesh']}" for r in report["lowering"]) == sorted(r.lstrip("^") for r in rows)
    for row in report["lowering"]:
        assert row["status"] == ("PASS" if HAVE_LIBTPU else "SKIP"), row
    # VPD's teacher context has an odd length of its own; bf16 attention there is cuDNN's too.
    vpd = next(r for r in report["lowering"] if r["entry_point"] == "iteration_vpd_pipo_bf16")
    lengths = vpd["export"]["cuda"]["lengths"]
    assert lengths["policy"] % 2 == 1 and lengths["teacher"] % 2 == 1, lengths
    assert "__cudnn$fmhaSoftmaxBackward" in vpd["export"]["cuda"]["custom_calls"]


@pytest.mark.slow  # ~25 s on the 2-core machine: two compiles of the micro trainer's programs
def test_trainer_programs_count_the_resident_state_and_the_roofline():
    """The programs as the host loop runs them (micro GRPO + PIPO, one host device): the whole
    update takes the training state as its argument; generate adds the state it does not take
    (optimizer state, reference weights, stored batch) as resident bytes; FLOPs counted with
    trip counts give the arithmetic intensity and the bound per device kind."""
    r = readiness
    spec = r.small_spec("grpo", True)
    mesh = r.host_mesh((1, 1, 1))
    state = jax.eval_shape(lambda: r.sharded_steps.abstract_train_state(spec))
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))
    learn = r.trainer_program_row(spec, mesh, "learn", "H100", r.HOST_KINDS)
    gen = r.trainer_program_row(spec, mesh, "generate_resident", "H100", r.HOST_KINDS)
    assert learn["ok"] and gen["ok"]
    assert learn["resident_bytes"] == 0 and learn["argument_bytes"] >= state_bytes
    assert gen["resident_bytes"] == state_bytes - param_bytes > 0
    assert gen["resident_peak_bytes"] == gen["peak_bytes"] + gen["resident_bytes"]
    assert gen["margin_gb"] == pytest.approx(80.0 - gen["resident_peak_bytes"] / 1e9)
    for row in (learn, gen):
        assert row["arithmetic_intensity"] == pytest.approx(row["flops_per_device"] / row["bytes_per_device"])
        for kind, (peak, bw) in r.ROOFLINE.items():
            compute, memory = row["flops_per_device"] / peak, row["bytes_per_device"] / bw
            assert row["bound"][kind] == ("compute" if compute >= memory else "memory")
            assert row["roofline_s"][kind] == pytest.approx(max(compute, memory))
            assert row["mfu_at_roofline"][kind] == pytest.approx(compute / max(compute, memory))


# The PI step's peak against the base step's (same shapes: the stored batch is the base step's batch
# of the iteration before). A `lax.cond` returning params and optimizer state held them twice and put
# the PI step 18% above the base step here (8B at fsdp=8 on the GPU target: 49.1 GB against 41.1).
PI_STEP_PEAK_MARGIN = 1.05


@pytest.mark.parametrize("platform", ["cuda", "cpu"])
def test_pi_step_peak_within_margin_of_the_base_step(platform):
    """Each target's form of the PI step (the accelerators' conditional gradients, the CPU's gated
    update) needs no more memory than the base step it mirrors, as the report compiles them
    (micro GRPO + PIPO, one layer, one host device): arguments + outputs + temporaries."""
    r = readiness
    c = importlib.import_module("configs.grpo").get_config("micro")
    c.pipo.enabled = True
    spec = r.for_target(spec_of(c), platform)
    programs = r.paper_programs(spec, r.host_mesh((1, 1, 1)))
    peak = {name: programs[name]().compile_with_memory()[1]["peak_bytes"] for name in ("base_step", "pi_step")}
    assert peak["pi_step"] <= PI_STEP_PEAK_MARGIN * peak["base_step"], peak
