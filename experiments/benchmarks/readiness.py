"""Accelerator readiness on a CPU host: export, TPU compile, per-device memory, FLOPs, roofline.

    python -m experiments.benchmarks.readiness [--quick] [--only REGEX,...] [--parts lowering,paper] [--out FILE.json]

With no accelerator (8 simulated CPU devices, `libtpu` for deviceless TPU compiles):

1. **lowering**: every entry point (fused log-prob chunked and Pallas + grad; Qwen3
   forward + grad; prefill; decode step; `generate`; the engine's prefill / insert /
   generate; the trainer iteration of every algorithm with and without PIPO) on the tiny
   model, sharded on meshes 1x8x1, 1x4x2, 2x2x2 (data x fsdp x tensor), exported with
   `jax.export` for `tpu` and `cuda`, and compiled with libtpu for a TPU v5p slice of 8
   chips. The custom calls of each exported program are listed (a Pallas kernel exported
   for TPU must be a Mosaic call, not the interpreter; no host CPU kernel may appear).
2. **memory**: `qwen3_4b` / `qwen3_8b` GRPO + PIPO at paper Table 5 (128 prompts x 8,
   512 prompt + 4096 response tokens, mini-batch 64 prompts, the config's micro-batch and
   epochs): prepare, PI step, base step, generate compiled with abstract sharded inputs
   (`jax.ShapeDtypeStruct`, nothing allocated) for fsdp=8 on the host's 8 devices
   (XLA:CPU programs: there is no GPU compiler here), for the GPU target on the same 8 devices
   (`gpu fsdp=8`: the cuda programs, the splash kernel run by the Pallas interpreter standing in
   for cuDNN's block-wise flash attention, compiled by XLA:CPU) and for TPU v5p-8 (4 chips,
   fsdp=4) / v5p-16 (8 chips, fsdp=8); per-device peak = arguments + outputs + temporaries -
   aliased (on TPU the buffer assignment's total). On the GPU target generate is also compiled
   with each `rollout.decode_weights` layout (memory, bytes all-gathered per decode step).
3. **flops**: per-device FLOPs and bytes of every program counted from its compiled HLO
   with loop trip counts (`hlo_cost`; XLA's own cost analysis counts a loop body once, and
   XLA:TPU writes no trip counts: they are read from the loops), the base step's against
   the model FLOPs, and a roofline time per program: a TPU program's for TPU v5p (its
   kernels' FLOPs, splash attention's, are not in the HLO: a lower bound), a host program's
   for H20, H100 and TPU v5p (its attention the CPU form with `[T, T]` scores); none for a
   GPU-target program (the interpreter's grid loops are not the kernel's cost); the whole
   update's largest byte terms by source op.

Targets, each reported PASS / FAIL as measured:
- every entry point exports for tpu and cuda, and its TPU program compiles;
- 8B: every program's per-device peak <= 48 GB; 4B: <= 32 GB (each target; the GPU target's
  rows are the figure a GPU user plans with until `device_check.py` runs on a GPU);
- prepare's peak at 1024 rows within 10% of its peak at 128 rows (v5p-16, else the host);
- temporaries of the base step grow linearly in sequence length: 4608 / 2304 tokens <= 2.1x
  (v5p-16, else the host);
- base step per-device FLOPs x devices <= 1.4x model FLOPs (full remat: 8 x params x
  tokens + attention fwd x 4).

Writes `experiments/results/readiness.json` (commit, package versions, machine, date).
Compiling 8B programs on a small CPU host takes minutes each: `--quick` runs a subset
(two meshes, GRPO only, 4B on the host only), `--only` filters rows by name.
"""

from __future__ import annotations

import os
import sys

# The host set-up below applies when this file runs as the report (`python -m ...`), never on
# import: a process that imports its helpers (the test session) keeps its own devices.
from pipo_jax import platforms  # noqa: E402  (imports no jax)

if __name__ == "__main__":
    platforms.simulate_cpu_devices(platforms.requested_cpu_devices(os.environ, default=8))
    # With libtpu installed JAX would try to start a TPU client on a host without one; the TPU
    # programs here are compiled for a topology description instead (deviceless).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # libtpu describes the host it runs on from these; there is no TPU here, so name one (quiets its
    # start-up errors; the topologies compiled for are chosen explicitly below). Deviceless compiles
    # hold no chip, so concurrent runs may each load libtpu (it otherwise takes a lock file).
    for _key, _value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", "v5p-8"),
                         ("TPU_WORKER_HOSTNAMES", "localhost"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
        os.environ.setdefault(_key, _value)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import importlib  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform as host_platform  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax._src.cudnn import fused_attention_stablehlo  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from configs import grpo  # noqa: E402
from experiments.benchmarks import hlo_cost, memory_accounting, readiness_tables  # noqa: E402
from experiments.benchmarks.readiness_tables import GB, PLATFORMS, SMALL_MESHES  # noqa: E402
from pipo_jax import parallel  # noqa: E402
from pipo_jax.kernels import logprobs, logprobs_sharded  # noqa: E402
from pipo_jax.models import qwen3  # noqa: E402
from pipo_jax.parallel.context import sharding_context  # noqa: E402
from pipo_jax.parallel.rules import make_rules, replicated  # noqa: E402
from pipo_jax.parallel.shardings import batch_shardings, tree_shardings  # noqa: E402
from pipo_jax.rl import learn as learn_lib  # noqa: E402
from pipo_jax.rl import rollout as rollout_lib  # noqa: E402
from pipo_jax.rl import steps as rl_steps  # noqa: E402
from pipo_jax.rl.hyper import hyperparameters_of  # noqa: E402
from pipo_jax.rl.response_logprobs import response_logprobs  # noqa: E402
from pipo_jax.config.sections import RunConfig  # noqa: E402
from pipo_jax.rl.spec import TrainSpec, spec_from_config  # noqa: E402
from pipo_jax.rl.state import make_optimizer  # noqa: E402
from pipo_jax.run import sharded_steps  # noqa: E402
from pipo_jax.run.setup import make_model_config, train_spec
from pipo_jax.sampling import decode
from pipo_jax.sampling import engine as engine_lib  # noqa: E402
from pipo_jax.sampling import sampler
from pipo_jax.sampling.sampling_params import SamplingParams  # noqa: E402
from pipo_jax.tasks.dataset import DatasetTask  # noqa: E402

ALGORITHMS = ("ppo", "grpo", "gspo", "dapo", "sdpo", "vpd")
# TPU v5p slices by name: chips as a topology (one JAX device per chip, megacore).
TPU_TOPOLOGIES = {"v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2"}
SMALL_TPU = "v5p-16"  # 8 chips: every small mesh fits
# Dense bf16 peak FLOP/s and HBM bytes/s per device (data sheets).
ROOFLINE = {"H20": (148e12, 4.0e12), "H100": (989e12, 3.35e12), "TPU v5p": (459e12, 2.76e12)}
# The device kinds a program's roofline is given for: a TPU program's for the TPU; a host program
# stands for every kind (no GPU compiler here), its attention the CPU form.
TPU_KINDS = ("TPU v5p",)
HOST_KINDS = tuple(ROOFLINE)
BYTE_TERMS = 5  # a trainer row's largest byte terms kept in the report
MEMORY_LIMIT_GB = {"qwen3_8b": 48.0, "qwen3_4b": 32.0}
FLOPS_RATIO_LIMIT = 1.4
LINEAR_RATIO_LIMIT = 2.1  # temporaries a + b*T give <= 2.0 for doubling T; [T, T] scores give up to 4
PREPARE_SAME_LIMIT = 1.10
RESULTS = os.path.join(os.path.dirname(__file__), "..", "results", "readiness.json")


# ----------------------------------------------------------------------------- target platform

def for_target(spec: TrainSpec, target: str) -> TrainSpec:
    """`spec` as built for `target` ("tpu", "cuda", "cpu").

    The one place the target platform reaches the code under test: it sets the model config's
    target-platform field, so a program exported here for TPU carries the TPU's backend choices.
    A model config without that field is left as it is, and its backend choices follow the host
    at trace time (`jax.default_backend()`).
    """
    fields = {f.name for f in dataclasses.fields(spec.model)}
    for name in ("platform", "target_platform"):
        if name in fields:
            return dataclasses.replace(spec, model=spec.model.replace(**{name: target}))
    return spec


def platform_note(spec: TrainSpec) -> str:
    fields = {f.name for f in dataclasses.fields(spec.model)}
    return "target platform from the config" if fields & {"platform", "target_platform"} else \
        "no target-platform setting: backend choices follow the host (jax.default_backend())"


# ----------------------------------------------------------------------------- meshes

_TOPOLOGY_CACHE: dict[str, Any] = {}


def libtpu_status() -> str:
    """'' when libtpu can describe a TPU topology, else why not."""
    try:
        tpu_devices("v5p-8")
        return ""
    except Exception as e:  # noqa: BLE001 (reported, not hidden)
        return memory_accounting.first_line(e)


def tpu_devices(slice_name: str) -> list:
    """Compile-only devices of a TPU slice (needs libtpu; no TPU)."""
    if slice_name not in _TOPOLOGY_CACHE:
        _TOPOLOGY_CACHE[slice_name] = topologies.get_topology_desc(TPU_TOPOLOGIES[slice_name], "tpu").devices
    return list(_TOPOLOGY_CACHE[slice_name])


def host_mesh(shape: tuple[int, int, int]) -> Mesh:
    return parallel.make_mesh(*shape, devices=jax.devices()[: int(np.prod(shape))])


def tpu_mesh(shape: tuple[int, int, int], slice_name: str) -> Mesh:
    devices = tpu_devices(slice_name)
    if int(np.prod(shape)) != len(devices):
        raise ValueError(f"mesh {shape} does not use the {len(devices)} chips of {slice_name}")
    return parallel.make_mesh(*shape, devices=devices)


def mesh_name(shape) -> str:
    return "x".join(map(str, shape))


# ----------------------------------------------------------------------------- programs

@dataclasses.dataclass
class Program:
    """A jitted function and abstract (sharded) arguments, traced inside `sharding_context(mesh, rules)`."""

    fn: Callable
    args: tuple
    mesh: Mesh
    rules: Any = None
    lengths: dict = dataclasses.field(default_factory=dict)  # sequence lengths its attention sees

    def lower(self):
        with sharding_context(self.mesh, self.rules):
            return self.fn.lower(*self.args)

    def compile_with_memory(self) -> tuple:
        """(compiled, `memory_accounting.memory_row`): on TPU the figure held to a limit is the
        buffer assignment's total (`memory_accounting.compile_accounted`), elsewhere the bound."""
        compiled, assigned = memory_accounting.compile_accounted(self.lower(), self.mesh.devices.flat[0].platform)
        return compiled, memory_accounting.memory_row(compiled, assigned)

    def export(self, platforms: tuple[str, ...]):
        # Triton and cuDNN calls carry no serialization-compatibility guarantee; this export checks
        # that the program lowers, it is not stored, so that check is off for them.
        unstable = [jax.export.DisabledSafetyCheck.custom_call(t) for t in PALLAS_CALLS["cuda"] + CUDNN_CALLS]
        with sharding_context(self.mesh, self.rules), cudnn_probe_for_export():
            return jax.export.export(self.fn, platforms=platforms, disabled_checks=unstable)(*self.args)


# jax's cuDNN attention lowering calls for the installed cuDNN library's version first (a host
# probe: the exported program does not depend on it). A CPU host has no cuDNN, so the export
# stands in the version of the cuDNN that jax's CUDA 12 wheels ship (9.8); a host with cuDNN
# keeps its own answer.
CUDNN_CALLS = ("__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward")
CUDNN_STAND_IN_VERSION = 90800


@contextlib.contextmanager
def cudnn_probe_for_export():
    fa = fused_attention_stablehlo
    probe = fa.check_cudnn_version
    try:
        probe()
    except RuntimeError:  # "cuDNN is not detected."
        fa.check_cudnn_version = lambda: CUDNN_STAND_IN_VERSION
        try:
            yield
        finally:
            fa.check_cudnn_version = probe
    else:
        yield


def abstract(tree, shardings):
    """ShapeDtypeStructs of `tree` carrying `shardings` (nothing allocated)."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def small_spec(algorithm: str, pipo: bool, dtype: str = "") -> TrainSpec:
    """The `micro` preset of `algorithm` on the built-in task's two-layer model (`task_tiny`: the layer loop
    of the programs the trainer runs); `dtype` sets `model.dtype` (the compute dtype; "bfloat16" as the
    paper presets, over float32 masters)."""
    c = importlib.import_module(f"configs.{algorithm}").get_config("micro")
    c.model.preset = "task_tiny"
    c.pipo.enabled = pipo
    if dtype:
        c.model.dtype = dtype
    return train_spec(RunConfig.from_config(c))


def _params(spec: TrainSpec, mesh: Mesh, rules=None):
    shapes = jax.eval_shape(lambda: qwen3.init_params(spec.model, jax.random.PRNGKey(0)))
    sh = tree_shardings(shapes, qwen3.param_axes(spec.model), mesh, rules)
    return abstract(shapes, sh), sh


def _rows(shape, dtype, mesh, rules=None):
    """An abstract batch-major array split over the batch axes."""
    x = jax.ShapeDtypeStruct(shape, dtype)
    return abstract(x, batch_shardings(x, mesh, rules))


def build_logprobs(impl: str):
    def build(spec: TrainSpec, mesh: Mesh) -> Program:
        m = spec.model
        params, p_sh = _params(spec, mesh)
        n = 64
        hidden = _rows((n, m.hidden_size), m.jnp_dtype, mesh)
        targets = _rows((n,), jnp.int32, mesh)

        target = {"platform": m.platform} if hasattr(m, "platform") else {}  # the kernel's target, where it takes one

        def loss(h, p, t):
            w = qwen3.lm_head_weight(m, p).astype(h.dtype)
            return jnp.sum(logprobs_sharded.token_logprobs(h, w, t, logprobs.kernel_config(impl=impl, **target)))

        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        return Program(fn, (hidden, params, targets), mesh)

    return build


def build_forward_grad(spec: TrainSpec, mesh: Mesh) -> Program:
    params, _ = _params(spec, mesh)
    b, p, r = 16, 8, 8
    tokens = _rows((b, p + r), jnp.int32, mesh)
    mask = _rows((b, p + r), jnp.int32, mesh)

    def loss(params, tokens, mask):
        logp, _ = response_logprobs(spec.model, params, tokens, mask, p, impl=spec.logprob_impl)
        return jnp.mean(logp)

    return Program(jax.jit(jax.value_and_grad(loss)), (params, tokens, mask), mesh)


def decode_shardings(tree, mesh: Mesh):
    """Batch-major leaves split over the batch axes; a `qwen3.KVCache` (layer-major) by its own rule."""
    def one(x):
        if isinstance(x, qwen3.KVCache):
            return tree_shardings(x, qwen3.KVCache(decode.KV_CACHE_AXES, decode.KV_CACHE_AXES), mesh)
        return batch_shardings(x, mesh)

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, qwen3.KVCache))


def decode_weights(model: qwen3.Qwen3Config, params):
    """What `decode.prefill` / `decode.decode_step` take: the re-laid-out weights where the decoder
    has a `prepare_weights`, else the params as stored. The one place that API differs."""
    prepare = getattr(decode, "prepare_weights", None)
    return params if prepare is None else prepare(model, params)


def build_prefill(spec: TrainSpec, mesh: Mesh) -> Program:
    params, _ = _params(spec, mesh)
    tokens = _rows((16, 16), jnp.int32, mesh)
    mask = _rows((16, 16), jnp.int32, mesh)

    def prefill(params, tokens, mask):
        return decode.prefill(spec.model, decode_weights(spec.model, params), tokens, mask, 32)

    return Program(jax.jit(prefill), (params, tokens, mask), mesh)


def build_decode(spec: TrainSpec, mesh: Mesh) -> Program:
    params, _ = _params(spec, mesh)
    b, width = 16, 32
    cache = jax.eval_shape(lambda: decode.init_cache(spec.model, b, width))
    cache = abstract(cache, decode_shardings(cache, mesh))
    tokens = _rows((b,), jnp.int32, mesh)
    positions = _rows((b,), jnp.int32, mesh)

    def step(params, cache, tokens, positions):
        return decode.decode_step(spec.model, decode_weights(spec.model, params), cache, tokens, positions)

    return Program(jax.jit(step), (params, cache, tokens, positions), mesh)


def build_generate(spec: TrainSpec, mesh: Mesh) -> Program:
    params, _ = _params(spec, mesh)
    b, p = 16, 16
    tokens = _rows((b, p), jnp.int32, mesh)
    mask = _rows((b, p), jnp.int32, mesh)

    def gen(params, tokens, mask, rng):
        return sampler.generate(spec.model, params, tokens, mask, rng,
                                SamplingParams(max_new_tokens=8, temperature=1.0))

    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))
    return Program(jax.jit(gen), (params, tokens, mask, rng), mesh)


def _engine(spec: TrainSpec) -> engine_lib.Engine:
    return engine_lib.Engine(spec.model, SamplingParams(max_new_tokens=8, temperature=1.0),
                             max_concurrent_decodes=16, max_len=32)


def build_engine_prefill(spec: TrainSpec, mesh: Mesh) -> Program:
    eng = _engine(spec)
    params, _ = _params(spec, mesh)
    tokens = jax.ShapeDtypeStruct((16,), jnp.int32, sharding=replicated(mesh))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))

    def prefill(params, tokens, rng):  # load_params inside: the export takes the model's own params
        return eng.prefill(eng.load_params(params), tokens, 5, rng)

    return Program(jax.jit(prefill), (params, tokens, rng), mesh)


def build_engine_generate(spec: TrainSpec, mesh: Mesh) -> Program:
    eng = _engine(spec)
    params, _ = _params(spec, mesh)
    state = jax.eval_shape(eng.init_decode_state)
    state = abstract(state, decode_shardings(state, mesh))

    def step(params, state):
        return eng.generate(eng.load_params(params), state)

    return Program(jax.jit(step), (params, state), mesh)


def build_engine_insert(spec: TrainSpec, mesh: Mesh) -> Program:
    eng = _engine(spec)
    params, _ = _params(spec, mesh)
    state = jax.eval_shape(eng.init_decode_state)
    state = abstract(state, decode_shardings(state, mesh))
    tokens = jax.ShapeDtypeStruct((16,), jnp.int32, sharding=replicated(mesh))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))

    def prefill_insert(params, tokens, rng, state):
        prefix = eng.prefill(eng.load_params(params), tokens, 5, rng)
        return eng.insert(prefix, eng.resize(state, eng.width_for(16)), 3)

    return Program(jax.jit(prefill_insert), (params, tokens, rng, state), mesh)


def build_iteration(algorithm: str, pipo: bool, dtype: str = ""):
    def build(_: TrainSpec, mesh: Mesh, target: str) -> Program:
        spec = for_target(small_spec(algorithm, pipo, dtype), target)
        chunk = sharded_steps.sharded_scan_chunk(spec, mesh, 1)
        state = abstract(sharded_steps.abstract_train_state(spec),
                         sharded_steps.state_shardings(spec, mesh, chunk.rules))
        return Program(chunk.jitted, (state,), mesh, chunk.rules, sequence_lengths(spec))

    build.takes_target = True
    return build


def sequence_lengths(spec: TrainSpec) -> dict[str, int]:
    """The lengths an iteration's attention runs at: the policy's prompt + response and, for
    SDPO / VPD, the teacher's context + response."""
    out = {"policy": spec.prompt_len + spec.rollout.max_new_tokens}
    if spec.uses_teacher:
        shapes = jax.eval_shape(lambda t: _sample_problems(spec, t, jax.random.PRNGKey(0)), spec.task.prompt_table())
        b, p, r = spec.batch, spec.prompt_len, spec.rollout.max_new_tokens
        rollout = jax.eval_shape(lambda problems: rollout_lib.Rollout(
            problems=problems, tokens_bl=jnp.zeros((b, p + r), jnp.int32), mask_bl=jnp.zeros((b, p + r), jnp.int32),
            sample_logp_br=jnp.zeros((b, r), jnp.float32), rewards_b=jnp.zeros((b,), jnp.float32)), shapes)
        out["teacher"] = jax.eval_shape(lambda ro: learn_lib.teacher_contexts(spec, ro, ro.rewards_b)[0],
                                        rollout).shape[1]
    return out


def entry_points(quick: bool) -> dict[str, Callable]:
    """{name: builder(spec, mesh[, target]) -> Program}: every entry point, tiny shapes."""
    table = {
        "logprobs_chunked": build_logprobs("chunked"),
        "logprobs_pallas": build_logprobs("pallas"),
        "qwen3_forward_grad": build_forward_grad,
        "prefill": build_prefill,
        "decode_step": build_decode,
        "generate": build_generate,
        "engine_prefill": build_engine_prefill,
        "engine_insert": build_engine_insert,
        "engine_generate": build_engine_generate,
    }
    for alg in ("grpo",) if quick else ALGORITHMS:
        for pipo in (False, True):
            table[f"iteration_{alg}{'_pipo' if pipo else ''}"] = build_iteration(alg, pipo)
    # In the paper presets' compute dtype: bf16 -> cuDNN flash attention on cuda, splash on tpu,
    # at the micro preset's odd lengths (T = 11; VPD's teacher context T = 23).
    for alg in BF16_ITERATIONS[:1] if quick else BF16_ITERATIONS:
        table[f"iteration_{alg}_pipo_bf16"] = build_iteration(alg, True, "bfloat16")
    return table


BF16_ITERATIONS = ("grpo", "vpd")
# The fused attention kernel a bf16 program must carry, per platform (the rows ending in "_bf16").
BF16_ATTENTION_CALLS = {"tpu": "tpu_custom_call", "cuda": "__cudnn$fmhaSoftmaxBackward"}


def build_program(builder, mesh: Mesh, target: str) -> Program:
    if getattr(builder, "takes_target", False):
        return builder(None, mesh, target)
    return builder(for_target(small_spec("grpo", False), target), mesh)


# ----------------------------------------------------------------------------- lowering

_CUSTOM_CALL = re.compile(r"stablehlo\.custom_call\s*@([\w.$\-]+)|call_target_name\s*=\s*\"([^\"]+)\"")
HOST_ONLY_CALLS = ("cpu_gemv", "cpu_attention", "pipo_jax")  # the package's C++ host kernels
# A Pallas kernel lowered for the device: Mosaic on TPU, Triton on GPU (jax's two call targets).
PALLAS_CALLS = {"tpu": ("tpu_custom_call",), "cuda": ("__gpu$xla.gpu.triton", "triton_kernel_call")}


def custom_calls(mlir_text: str) -> list[str]:
    return sorted({a or b for a, b in _CUSTOM_CALL.findall(mlir_text)} - {"Sharding", "SPMDFullToShardShape",
                                                                           "SPMDShardToFullShape"})


def export_check(name: str, prog_for: Callable[[str], Program]) -> dict:
    """Exports for each platform; what custom calls each program holds; PASS if both export and the
    Pallas log-prob carries its platform's kernel (Mosaic / Triton) and no host CPU kernel is present."""
    out = {}
    for plat in PLATFORMS:
        t0 = time.perf_counter()
        try:
            prog = prog_for(plat)
            exp = prog.export((plat,))
            calls = custom_calls(exp.mlir_module())
            problems = [c for c in calls if any(h in c for h in HOST_ONLY_CALLS)]
            if name == "logprobs_pallas":
                want = PALLAS_CALLS[plat]
                if not any(w in c for c in calls for w in want):
                    problems.append(f"no {' / '.join(want)} call: the Pallas kernel was not lowered for {plat}")
            if name.endswith("_bf16") and BF16_ATTENTION_CALLS[plat] not in calls:
                problems.append(f"no {BF16_ATTENTION_CALLS[plat]} call: bf16 attention is not the fused kernel")
            out[plat] = {"ok": not problems, "custom_calls": calls, "problems": problems,
                         "seconds": time.perf_counter() - t0}
            if prog.lengths:
                out[plat]["lengths"] = prog.lengths
        except Exception as e:  # noqa: BLE001 (a FAIL row with the reason)
            out[plat] = {"ok": False, "error": memory_accounting.first_line(e), "seconds": time.perf_counter() - t0}
    return out


def tpu_compile_check(prog: Program) -> dict:
    t0 = time.perf_counter()
    try:
        _, mem = prog.compile_with_memory()
        return {"ok": True, "seconds": time.perf_counter() - t0, "peak_bytes": mem["peak_bytes"]}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": memory_accounting.first_line(e), "seconds": time.perf_counter() - t0}


def run_lowering(quick: bool, only: list[str], have_tpu: bool, rows: list, save=lambda: None, log=print) -> list:
    """Appends one row per (entry point, mesh) to `rows`; `save()` after each."""
    meshes = SMALL_MESHES[:2] if quick else SMALL_MESHES
    for name, builder in entry_points(quick).items():
        for shape in meshes:
            row_name = f"{name}@{mesh_name(shape)}"
            if not selected(row_name, only):
                continue
            row = {"entry_point": name, "mesh": mesh_name(shape)}
            row["export"] = export_check(name, lambda plat: build_program(builder, host_mesh(shape), plat))
            if have_tpu:
                try:
                    prog = build_program(builder, tpu_mesh(shape, SMALL_TPU), "tpu")
                    row["tpu_compile"] = tpu_compile_check(prog)
                except Exception as e:  # noqa: BLE001
                    row["tpu_compile"] = {"ok": False, "error": memory_accounting.first_line(e)}
            else:
                row["tpu_compile"] = {"ok": None, "error": "libtpu absent"}
            row["status"] = status(all(row["export"][p]["ok"] for p in PLATFORMS) and row["tpu_compile"]["ok"])
            rows.append(row)
            log(format_lowering_row(row))
            save()
    return rows


def selected(row_name: str, only: list[str]) -> bool:
    """Whether `--only` (regular expressions, any may match) selects a row; everything when empty."""
    return not only or any(re.search(o, row_name) for o in only)


def status(ok) -> str:
    return "SKIP" if ok is None else "PASS" if ok else "FAIL"


def format_lowering_row(row: dict) -> str:
    def cell(r):
        if r.get("ok") is None:
            return "skip"
        return "ok" if r["ok"] else "FAIL"

    why = []
    for plat in PLATFORMS:
        r = row["export"][plat]
        if not r["ok"]:
            why.append(f"{plat}: {r.get('error') or '; '.join(r.get('problems', []))}")
    tc = row["tpu_compile"]
    if tc.get("ok") is False:
        why.append(f"tpu compile: {tc.get('error')}")
    calls = sorted(set(row["export"]["tpu"].get("custom_calls", []) + row["export"]["cuda"].get("custom_calls", [])))
    return (f"{row['status']:4} {row['entry_point']:26} {row['mesh']:6} tpu {cell(row['export']['tpu']):4} "
            f"cuda {cell(row['export']['cuda']):4} tpu-compile {cell(tc):4} calls {','.join(calls) or '-'}"
            + (f"  <- {' | '.join(why)}" if why else ""))


# ----------------------------------------------------------------------------- paper scale

SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "rope_theta", "rms_norm_eps", "max_position_embeddings",
                "tie_word_embeddings")


def paper_spec(model: str, prompts: int = 128, prompt_len: int = 512, response_len: int = 4096) -> TrainSpec:
    """GRPO + PIPO at paper Table 5 (`configs/grpo.py:<model>`), with a synthetic prompt table
    `[256, prompt_len]` standing in for the MATH file (only its shape enters the programs)."""
    c = grpo.get_config(model)
    c.pipo.enabled = True
    # Validate everything but the model files and the data file: the built-in task and model
    # stand in, then the preset's shapes replace the stand-in's (numerics and every other model
    # setting stay the config's).
    c.model.preset, c.task.name, c.task.epochs, c.eval.benchmarks = "task_tiny", "arithmetic", 0.0, ""
    c.rollout.max_new_tokens = 8
    c.rollout.prompts_per_batch = prompts
    if c.train.mini_batch_prompts > prompts:
        c.train.mini_batch_prompts = prompts
    c.rollout.max_new_tokens = response_len
    base_model = make_model_config(c.model)
    model_cfg = base_model.replace(**{k: getattr(qwen3.preset(model), k) for k in SHAPE_FIELDS})
    n = 256
    table = np.full((n, prompt_len), 151643, np.int32)
    table[:, -16:] = 1000  # left-padded prompts of 16 real tokens
    task = DatasetTask(kind="math", prompt_tokens_np=table, prompt_lengths_np=np.full((n,), 16, np.int32),
                       references=("0",) * n, train_rows_np=np.arange(n - 8), heldout_rows_np=np.arange(n - 8, n),
                       stop_token_ids=(151645,), pad_id=151643)
    return spec_from_config(RunConfig.from_config(c), model_cfg, task)


def prompt_table(spec: TrainSpec, mesh: Mesh):
    """The task's prompt table (`Task.prompt_table`) as an abstract replicated argument of the
    rollout programs, or None when the task has none."""
    table = spec.task.prompt_table()
    return None if table is None else abstract(table, jax.tree.map(lambda _: replicated(mesh), table))


def _sample_problems(spec: TrainSpec, table, rng):
    return rollout_lib.sample_problems(spec.generation, rng, spec.rollout.prompts_per_batch, table=table)


def _abstract_rollout(spec: TrainSpec, mesh: Mesh, rules):
    b, p, r = spec.batch, spec.prompt_len, spec.rollout.max_new_tokens
    table = prompt_table(spec, mesh)
    shapes = jax.eval_shape(lambda t: rollout_lib.Rollout(
        problems=_sample_problems(spec, t, jax.random.PRNGKey(0)),
        tokens_bl=jnp.zeros((b, p + r), jnp.int32), mask_bl=jnp.zeros((b, p + r), jnp.int32),
        sample_logp_br=jnp.zeros((b, r), jnp.float32), rewards_b=jnp.zeros((b,), jnp.float32)), table)
    return shapes, batch_shardings(shapes, mesh, rules)


def paper_programs(spec: TrainSpec, mesh: Mesh) -> dict[str, Callable[[], Program]]:
    """{name: () -> Program} of one GRPO + PIPO iteration's programs on `mesh` (abstract inputs)."""
    rules = make_rules(None)
    state_sh = sharded_steps.state_shardings(spec, mesh, rules)
    state = abstract(sharded_steps.abstract_train_state(spec), state_sh)
    rollout_shapes, rollout_sh = _abstract_rollout(spec, mesh, rules)
    rollout = abstract(rollout_shapes, rollout_sh)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))
    batch_shapes = jax.eval_shape(lambda s, r: learn_lib.prepare(spec, s, r)[0], state, rollout)
    batch_sh = batch_shardings(batch_shapes, mesh, rules)
    batch = abstract(batch_shapes, batch_sh)
    mu = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated(mesh))

    def prepare():
        fn = jax.jit(lambda s, r: learn_lib.prepare(spec, s, r)[0], in_shardings=(state_sh, rollout_sh),
                     out_shardings=batch_sh)
        return Program(fn, (state, rollout), mesh, rules)

    def pi_step():
        def step(params, opt_state, pipo_state, mu_t, rng):
            return learn_lib.pi_step(spec, params, opt_state, pipo_state, mu_t, rng,
                                     hyper=hyperparameters_of(spec))[:2]

        fn = jax.jit(step, in_shardings=(state_sh.params, state_sh.opt_state, state_sh.pipo, replicated(mesh),
                                         replicated(mesh)),
                     out_shardings=(state_sh.params, state_sh.opt_state), donate_argnums=(0, 1))
        return Program(fn, (state.params, state.opt_state, state.pipo, mu, rng), mesh, rules)

    def base_step():
        def step(params, opt_state, batch, rng):
            return rl_steps.minibatch_updates(spec, rl_steps.base_loss_fn(spec, hyper=hyperparameters_of(spec)),
                                              make_optimizer(spec.train.lr, spec),
                                              params, opt_state, batch, rng)[:2]

        fn = jax.jit(step, in_shardings=(state_sh.params, state_sh.opt_state, batch_sh, replicated(mesh)),
                     out_shardings=(state_sh.params, state_sh.opt_state), donate_argnums=(0, 1))
        return Program(fn, (state.params, state.opt_state, batch, rng), mesh, rules)

    def generate():
        gen = sharded_steps.sharded_generate(spec, mesh, spec.rollout.prompts_per_batch, rules)
        table = prompt_table(spec, mesh)
        args = (state.params, rng) if table is None else (state.params, table, rng)
        return Program(gen.jitted, args, mesh, gen.rules)

    return {"prepare": prepare, "pi_step": pi_step, "base_step": base_step, "generate": generate}


PAPER_PROGRAMS = ("prepare", "pi_step", "base_step", "generate")
# HBM per chip (data sheets), for the margin of a program with the training state resident.
DEVICE_MEMORY_GB = {"TPU v5p": 95.74, "H100": 80.0, "H20": 96.0}


def per_device_bytes(tree) -> int:
    """Bytes one device holds of `tree`'s abstract sharded leaves (its shard of each)."""
    return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def trainer_programs(spec: TrainSpec, mesh: Mesh) -> dict[str, tuple[Callable[[], Program], int]]:
    """The programs the host loop runs, as it runs them: {name: (() -> Program, resident bytes
    per device outside the program's arguments)}. "learn" is the whole update
    (`sharded_steps.sharded_learn`: prepare + PI step + base step in one program, the training
    state its argument); "generate" takes the params while the rest of the training state
    (optimizer state, reference weights, stored batch, ...) stays on the device beside it."""
    rules = make_rules(None)
    state = abstract(sharded_steps.abstract_train_state(spec), sharded_steps.state_shardings(spec, mesh, rules))
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))

    def learn():
        fn = sharded_steps.sharded_learn(spec, mesh, rules)
        shapes = sharded_steps.abstract_rollout(spec, spec.rollout.prompts_per_batch)
        rollout = abstract(shapes, batch_shardings(shapes, mesh, fn.rules))
        return Program(fn.jitted, (state, rollout, rng), mesh, fn.rules)

    def generate():
        gen = sharded_steps.sharded_generate(spec, mesh, spec.rollout.prompts_per_batch, rules)
        table = prompt_table(spec, mesh)
        return Program(gen.jitted, (state.params, table, rng), mesh, gen.rules)

    rest = per_device_bytes(state) - per_device_bytes(state.params)
    return {"learn": (learn, 0), "generate_resident": (generate, rest)}


def trainer_program_row(spec: TrainSpec, mesh: Mesh, name: str, chip: str | None, kinds: tuple[str, ...]) -> dict:
    """One trainer program compiled: its peak, the peak with the training state resident, the
    margin to `chip`'s memory, and for the device `kinds` FLOPs, bytes, arithmetic intensity, the
    roofline bound per kind and the largest byte terms."""
    build, resident = trainer_programs(spec, mesh)[name]
    row = compile_program(("trainer", id(spec), name, mesh_name(mesh.devices.shape), chip), build, kinds,
                          byte_terms=True)
    row = dict(row, program=name, resident_bytes=resident)
    if row["ok"]:
        row["resident_peak_bytes"] = row["peak_bytes"] + resident
        if chip is not None:
            row["device_memory_gb"] = DEVICE_MEMORY_GB[chip]
            row["margin_gb"] = DEVICE_MEMORY_GB[chip] - row["resident_peak_bytes"] / GB
    if row["ok"] and kinds:
        row.update(roofline_detail(row["flops_per_device"], row["bytes_per_device"], kinds))
    return row


def roofline_detail(flops: float, nbytes: float, kinds: tuple[str, ...] = HOST_KINDS) -> dict:
    """Arithmetic intensity (FLOPs / byte) and, per device kind, which roof binds (compute when
    the intensity is above the ridge, peak / bandwidth) and the MFU at that bound."""
    intensity = flops / nbytes if nbytes else float("inf")
    out = {"arithmetic_intensity": intensity, "bound": {}, "mfu_at_roofline": {}}
    for kind in kinds:
        peak, bw = ROOFLINE[kind]
        compute, memory = flops / peak, nbytes / bw
        out["bound"][kind] = "compute" if compute >= memory else "memory"
        out["mfu_at_roofline"][kind] = compute / max(compute, memory) if flops else 0.0
    return out


_COMPILED: dict[tuple, dict] = {}


_HBM = re.compile(r"memory required for HLO temporaries \(([0-9.]+)([KMGT]?)\)")


def hbm_exceeded_bytes(message: str) -> float | None:
    """The temporaries XLA:TPU's 'Ran out of memory on HBM' error reports, in bytes (None if absent)."""
    m = _HBM.search(message)
    if m is None:
        return None
    return float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " ")


def compile_program(key: tuple, build: Callable[[], Program], kinds: tuple[str, ...] = (),
                    byte_terms: bool = False, decode_gathers: bool = False) -> dict:
    """Compiles `build()` once per `key` (model, target, program, shape): per-device memory, and for
    the device `kinds` FLOPs and bytes counted from the optimized HLO (`hlo_cost`: loop trip counts,
    on TPU read from the loops themselves; kernel custom calls' FLOPs not seen, `opaque_kernels`
    says how many) and roofline times; with `byte_terms` the largest byte terms by source op; with
    `decode_gathers` the bytes its decode loops all-gather in one step of each (every generation pass's loop:
    `hlo_cost.all_gather_bytes_in_decode_loops`)."""
    if key in _COMPILED:
        return _COMPILED[key]
    t0 = time.perf_counter()
    try:
        compiled, memory = build().compile_with_memory()
    except Exception as e:  # noqa: BLE001
        row = {"ok": False, "error": memory_accounting.first_line(e), "compile_s": time.perf_counter() - t0}
        needed = hbm_exceeded_bytes(str(e))
        if needed is not None:  # XLA:TPU refuses programs larger than the chip; it says by how much
            row["temp_bytes_at_least"] = needed
    else:
        row = {"ok": True, "compile_s": time.perf_counter() - t0, **memory}
    if row["ok"] and kinds:
        module = hlo_cost.parse(compiled.as_text())
        cost = hlo_cost.computation_cost(*module)
        row.update(flops_per_device=cost.flops, bytes_per_device=cost.bytes,
                   unknown_trip_counts=cost.unknown_trip_counts, opaque_kernels=cost.opaque_kernels,
                   roofline_s=roofline(cost.flops, cost.bytes, kinds))
        if byte_terms:
            terms = sorted(hlo_cost.byte_terms(*module).items(), key=lambda kv: -kv[1])[:BYTE_TERMS]
            row["largest_byte_terms"] = [[label, b] for label, b in terms]
    if row["ok"] and decode_gathers:
        row["all_gather_bytes_decode_loops"] = hlo_cost.all_gather_bytes_in_decode_loops(compiled.as_text())
    _COMPILED[key] = row
    return row


def model_train_flops(cfg: qwen3.Qwen3Config, rows: int, prompt: int, response: int, remat: bool) -> float:
    """Model FLOPs of forward + backward over `rows` sequences of prompt + response tokens.

    Forward: 2 x (decoder matmul params) per token, causal attention (QK^T and PV over on
    average seq / 2 keys), 2 x D x V for the LM head on the response tokens. Training is 3x
    forward, 4x with full remat (the forward runs again in the backward pass); the fused
    log-prob head recomputes its logits in the backward pass, so it is 4x in either case.
    """
    d, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hq, hkv, dh, v = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size
    seq = prompt + response
    per_layer = d * dh * (hq + 2 * hkv) + hq * dh * d + 3 * d * f
    decoder = 2.0 * layers * per_layer * rows * seq
    attention = 2.0 * 2.0 * layers * hq * dh * (seq * seq / 2) * rows
    head = 2.0 * d * v * rows * response
    return (4.0 if remat else 3.0) * (decoder + attention) + 4.0 * head


def roofline(flops: float, nbytes: float, kinds: tuple[str, ...] = HOST_KINDS) -> dict:
    """Step-time lower bound per device kind: max(FLOPs / peak, bytes / bandwidth), seconds."""
    return {k: max(flops / ROOFLINE[k][0], nbytes / ROOFLINE[k][1]) for k in kinds}


def cost_kinds(target: str) -> tuple[str, ...]:
    """The device kinds `target`'s programs give a roofline for: none for the GPU target, whose
    interpreted attention kernel (grid loops over whole buffers) is not the fused kernel's cost."""
    return TPU_KINDS if target in TPU_TARGETS else () if target == GPU_FSDP8 else HOST_KINDS


HOST_FSDP8 = "host fsdp=8"
GPU_FSDP8 = "gpu fsdp=8"
TPU_FSDP8 = "v5p-16 fsdp=8"
TPU_TARGETS = ("v5p-8 fsdp=4", TPU_FSDP8)
TARGETS = (HOST_FSDP8, GPU_FSDP8) + TPU_TARGETS
# The GPU target's device kinds (its programs are compiled by XLA:CPU: no GPU compiler here).
GPU_KINDS = ("H20", "H100")
# A GPU target's attention: cuDNN's flash attention is a GPU library call that XLA:CPU cannot
# compile, so the splash kernel (block-wise like it: no [T, T] scores), run by the Pallas
# interpreter, stands in for it; every other choice is the cuda program's.
GPU_ATTENTION_STAND_IN = "splash"


def target_mesh(target: str) -> Mesh:
    """The devices a paper-scale `target` compiles for: the host's 8 (host and GPU targets) or a TPU slice."""
    return {HOST_FSDP8: lambda: host_mesh((1, 8, 1)), GPU_FSDP8: lambda: host_mesh((1, 8, 1)),
            "v5p-8 fsdp=4": lambda: tpu_mesh((1, 4, 1), "v5p-8"),
            "v5p-16 fsdp=8": lambda: tpu_mesh((1, 8, 1), "v5p-16")}[target]()


def target_spec(spec: TrainSpec, target: str) -> TrainSpec:
    """`spec` as built for `target`: the TPU programs for a TPU slice; for the host, XLA:CPU's own
    program (its attention the `[T, T]` reference: GPU kernels do not compile for the CPU); for the
    GPU target, the cuda program with `GPU_ATTENTION_STAND_IN` in place of cuDNN's attention."""
    if target in TPU_TARGETS:
        return for_target(spec, "tpu")
    if target == GPU_FSDP8:
        spec = for_target(spec, "cuda")
        return dataclasses.replace(spec, model=spec.model.replace(attention_impl=GPU_ATTENTION_STAND_IN))
    return for_target(spec, "cpu")


def paper_row(model: str, target: str, program: str, prompts: int = 128, prompt_len: int = 512,
              response_len: int = 4096) -> dict:
    """One paper-scale program compiled for `target` (cached: the checks reuse the table's compiles)."""
    def build():
        spec = target_spec(paper_spec(model, prompts, prompt_len, response_len), target)
        return paper_programs(spec, target_mesh(target))[program]()

    return compile_program((model, target, program, prompts, prompt_len, response_len), build, cost_kinds(target))


def run_paper_scale(models: list[str], targets: list[str], only: list[str], out: dict, save=lambda: None,
                    log=print) -> dict:
    """Fills `out` {"memory": rows, "checks": rows}; `save()` after each row (a long run keeps what it has)."""
    out.setdefault("memory", [])
    out.setdefault("checks", [])
    for model in models:
        for target in targets:
            for name in PAPER_PROGRAMS:
                if not selected(f"{model}:{name}", only):
                    continue
                row = {"model": model, "target": target, "program": name, **paper_row(model, target, name)}
                row["limit_gb"] = MEMORY_LIMIT_GB[model]
                row["status"] = status(row["ok"] and row["peak_bytes"] <= row["limit_gb"] * GB)
                out["memory"].append(row)
                log(format_memory_row(row))
                save()
            # The programs as the trainer runs them, the training state resident (`trainer_programs`).
            for name in TRAINER_PROGRAMS:
                if not selected(f"{model}:{name}", only):
                    continue
                row = {"model": model, "target": target, **paper_trainer_row(model, target, name)}
                row["limit_gb"] = MEMORY_LIMIT_GB[model]
                row["status"] = status(row["ok"] and row["resident_peak_bytes"] <= row["limit_gb"] * GB)
                out.setdefault("trainer", []).append(row)
                log(format_trainer_row(row))
                save()
            if target == GPU_FSDP8 and selected(f"{model}:decode_weights", only):
                out.setdefault("decode_weights", []).extend(decode_weights_rows(model, target, log))
                save()
        if selected(f"{model}:checks", only):
            out["checks"] += paper_checks(model, TPU_FSDP8 if TPU_FSDP8 in targets else HOST_FSDP8, log)
            save()
    return out


TRAINER_PROGRAMS = ("learn", "generate_resident")


def paper_trainer_row(model: str, target: str, name: str) -> dict:
    chip = "TPU v5p" if target in TPU_TARGETS else "H20" if target == GPU_FSDP8 else None
    return trainer_program_row(target_spec(paper_spec(model), target), target_mesh(target), name, chip,
                               cost_kinds(target))


def decode_weights_rows(model: str, target: str, log=print) -> list[dict]:
    """Generate with the training state resident (`generate_resident`) compiled for `target` with each
    `rollout.decode_weights` layout: its memory, the bytes a decode step all-gathers (one step of each
    generation pass's decode loop, `decode_passes` of them, summed), and FLOPs and bytes
    counted from its HLO (`hlo_cost`: the decode loops exit on EOS, so they are counted once); `auto`
    marks the layout the paper preset's "auto" picks for the target's platform."""
    base = target_spec(paper_spec(model), target)
    chosen = rollout_lib.decode_weights_layout(base)
    rows = []
    for layout in ("gathered", "sharded"):
        spec = base.with_section("rollout", decode_weights=layout)
        build, resident = trainer_programs(spec, target_mesh(target))["generate_resident"]
        row = compile_program(("decode_weights", model, target, layout), build, GPU_KINDS, decode_gathers=True)
        mesh = target_mesh(target)
        shards = mesh.shape["data"] * mesh.shape["fsdp"]  # the batch axes
        passes = max(1, spec.batch // (spec.rollout.generate_rows_per_device * shards))
        row = dict(row, model=model, target=target, decode_weights=layout, auto=layout == chosen,
                   resident_bytes=resident, limit_gb=MEMORY_LIMIT_GB[model], decode_passes=passes)
        row.pop("roofline_s", None)  # a lower bound of loops counted once: the table gives the counts
        if row["ok"]:
            row["resident_peak_bytes"] = row["peak_bytes"] + resident
        rows.append(row)
        log(format_decode_weights_row(row))
    return rows


def format_decode_weights_row(row: dict) -> str:
    auto = " (auto)" if row["auto"] else ""
    head = f"{row['model']:9} {row['target']:14} decode_weights={row['decode_weights']:8}{auto}"
    if not row["ok"]:
        return f"{head} <- {row['error']}"
    gathers = row["all_gather_bytes_decode_loops"] / row["decode_passes"] / GB
    return (f"{head} peak {row['peak_bytes'] / GB:.2f} GB, state resident {row['resident_peak_bytes'] / GB:.2f} GB "
            f"(limit {row['limit_gb']:.0f}); all-gathered per decode step {gathers:.2f} GB; counted "
            f"{row['flops_per_device'] / 1e12:.0f} TFLOP, {row['bytes_per_device'] / 1e12:.1f} TB per device")


def format_trainer_row(row: dict) -> str:
    head = f"{row['status']:4} {row['model']:9} {row['target']:14} {row['program']:18}"
    if not row["ok"]:
        return f"{head} <- {row['error']}"
    s = (f"{head} peak {row['peak_bytes'] / GB:.2f} GB ({row['peak_basis']}), state resident "
         f"{row['resident_peak_bytes'] / GB:.2f} GB (limit {row['limit_gb']:.0f})")
    if "margin_gb" in row:
        s += f", margin {row['margin_gb']:.1f} of {row['device_memory_gb']:.0f} GB"
    if "arithmetic_intensity" in row:
        s += (f" | {row['arithmetic_intensity']:.0f} FLOP/B; " + " ".join(
            f"{k} {row['bound'][k]}-bound {row['roofline_s'][k]:.1f}s MFU<={100 * row['mfu_at_roofline'][k]:.0f}%"
            for k in row["bound"]))
        if row["opaque_kernels"]:
            s += f" (FLOPs outside {row['opaque_kernels']} kernel calls)"
    return s


def _ratio_check(model: str, name: str, a: dict, b: dict, field: str, limit: float) -> dict:
    ok = a["ok"] and b["ok"]
    value = a[field] / b[field] if ok else None
    return {"model": model, "check": name, "value": value, "limit": limit,
            "status": status(ok and value <= limit), "detail": {"numerator": a, "denominator": b}}


def paper_checks(model: str, memory_target: str, log) -> list[dict]:
    """On `memory_target` (the TPU slice when libtpu is present): prepare at 1024 vs 128 rows and
    base-step temporaries at 4608 vs 2304 tokens; on the host's XLA:CPU program: base-step FLOPs."""
    t = memory_target
    checks = [
        _ratio_check(model, f"prepare peak: 1024 rows / 128 rows [{t}]", paper_row(model, t, "prepare"),
                     paper_row(model, t, "prepare", prompts=16), "peak_bytes", PREPARE_SAME_LIMIT),
        _ratio_check(model, f"base-step temporaries: 4608 / 2304 tokens [{t}]", paper_row(model, t, "base_step"),
                     paper_row(model, t, "base_step", prompt_len=256, response_len=2048), "temp_bytes",
                     LINEAR_RATIO_LIMIT),
    ]
    step = paper_row(model, HOST_FSDP8, "base_step")
    spec = paper_spec(model)
    mf = model_train_flops(spec.model, spec.batch * spec.train.epochs, spec.prompt_len, spec.rollout.max_new_tokens,
                           remat=spec.model.remat == "full")
    value = step["flops_per_device"] * 8 / mf if step["ok"] else None
    checks.append({"model": model, "check": f"base-step FLOPs x 8 devices / model FLOPs [{HOST_FSDP8}]",
                   "value": value,
                   "limit": FLOPS_RATIO_LIMIT, "status": status(value is not None and value <= FLOPS_RATIO_LIMIT),
                   "detail": {"model_flops": mf, "compiled": step}})
    for c in checks:
        v = "n/a" if c["value"] is None else f"{c['value']:.3f}"
        log(f"{c['status']:4} {model:9} {c['check']:62} {v:>8} (limit {c['limit']})")
    return checks


def format_memory_row(row: dict) -> str:
    if not row["ok"]:
        at_least = (f"temp >= {row['temp_bytes_at_least'] / GB:.0f} GB " if "temp_bytes_at_least" in row else "")
        return f"{row['status']:4} {row['model']:9} {row['target']:14} {row['program']:10} {at_least}<- {row['error']}"
    s = (f"{row['status']:4} {row['model']:9} {row['target']:14} {row['program']:10} "
         f"peak {row['peak_bytes'] / GB:9.2f} GB ({row['peak_basis']}; bound {row['bound_bytes'] / GB:.2f}, args "
         f"{row['argument_bytes'] / GB:.2f}, temp {row['temp_bytes'] / GB:.2f}; XLA's peak "
         f"{row.get('xla_peak_bytes', 0) / GB:.2f}; limit {row['limit_gb']:.0f}) compile {row['compile_s']:.0f}s")
    if "roofline_s" in row:
        s += f" | TFLOP/dev {row['flops_per_device'] / 1e12:.1f} GB/dev {row['bytes_per_device'] / GB:.0f} roofline " + \
             " ".join(f"{k} {v:.1f}s" for k, v in row["roofline_s"].items())
        if row["unknown_trip_counts"]:
            s += f" (lower bound: {row['unknown_trip_counts']} data-dependent loops counted once)"
        if row.get("opaque_kernels"):
            s += f" (FLOPs outside {row['opaque_kernels']} kernel calls)"
    return s


# ----------------------------------------------------------------------------- report

def provenance() -> dict:
    def version(pkg):
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = ""
    return {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "packages": {p: version(p) for p in ("jax", "jaxlib", "libtpu", "flax", "optax", "numpy")},
            "machine": {"platform": host_platform.platform(), "processor": host_platform.processor(),
                        "cpus": os.cpu_count(), "host_devices": jax.device_count(),
                        "backend": jax.default_backend()}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two meshes, GRPO only, qwen3_4b on the host mesh only")
    ap.add_argument("--only", default="", help="comma-separated regular expressions; rows whose name matches "
                    "any run ('^generate@', 'iteration_grpo', '@1x4x2', 'qwen3_8b:prepare', 'qwen3_4b:checks')")
    ap.add_argument("--parts", default="lowering,paper", help="which parts: lowering, paper")
    ap.add_argument("--models", default="qwen3_4b,qwen3_8b")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help="paper-scale targets (the TPU slices need libtpu)")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--markdown", default="", help="print the tables of this JSON report as Markdown and exit")
    args = ap.parse_args(argv)
    # A program loaded from a persistent compilation cache is not compiled, so XLA writes no buffer
    # assignment for it (`memory_accounting.compile_accounted` needs one on TPU).
    jax.config.update("jax_enable_compilation_cache", False)
    if args.markdown:
        with open(args.markdown) as f:
            text = readiness_tables.markdown(json.load(f))
        print(text)
        return {"markdown": text}
    only = [o for o in args.only.split(",") if o]
    parts = set(args.parts.split(","))
    models = ["qwen3_4b"] if args.quick else [m for m in args.models.split(",") if m]

    tpu_missing = libtpu_status()
    result = {**provenance(), "args": vars(args), "libtpu": tpu_missing or "present",
              "platform_selection": platform_note(small_spec("grpo", False))}
    print(f"readiness: jax {jax.__version__}, {jax.device_count()} host devices; "
          + ("libtpu present: TPU programs compiled for v5p" if not tpu_missing else
             f"libtpu ABSENT ({tpu_missing}): TPU compiles skipped (pip install -e \".[readiness]\")"))
    print(f"platform selection: {result['platform_selection']}")
    targets = [t for t in args.targets.split(",") if t and (t not in TPU_TARGETS or not tpu_missing)]
    if args.quick:
        targets = [HOST_FSDP8]
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise SystemExit(f"--targets: unknown {sorted(unknown)}; expected of {list(TARGETS)}")
    t0 = time.perf_counter()

    def save():
        result["seconds"] = time.perf_counter() - t0
        result["summary"] = readiness_tables.summary_counts(result)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)

    if "lowering" in parts:
        print("\n== lowering: jax.export for tpu and cuda, TPU v5p compile (tiny model) ==")
        run_lowering(args.quick, only, not tpu_missing, result.setdefault("lowering", []), save)
    if "paper" in parts:
        print("\n== paper scale: GRPO + PIPO, Table 5 (per-device peak memory, FLOPs, roofline) ==")
        run_paper_scale(models, targets, only, result.setdefault("paper", {}), save)
    save()
    counts = result["summary"]
    print(f"\nsummary: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP "
          f"in {result['seconds']:.0f} s")
    if args.out:
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
