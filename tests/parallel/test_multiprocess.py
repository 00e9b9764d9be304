"""Two processes on localhost (gloo CPU collectives, 2 devices each, fsdp across the
processes): the PIPO iterations equal the single-process run, data is loaded and scored
per process, and the checkpoint both processes wrote restores in a single process."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pipo_jax.run import sharded_steps as steps
from pipo_jax.run.checkpoint import Checkpointer
from tests.parallel import scenario
from tests.parallel.equivalence import assert_run_matches

pytestmark = pytest.mark.slow  # the module fixture `multiprocess_run` runs the two worker processes


def _result(multiprocess_run) -> dict:
    with np.load(multiprocess_run[0] / "result.npz") as f:
        return dict(f)


def test_two_processes_match_single_process(multiprocess_run):
    r = _result(multiprocess_run)
    # fsdp is the cross-process axis: each process holds half of every parameter.
    np.testing.assert_array_equal(r["mesh_process_grid"], [[0, 0], [1, 1]])
    assert str(r["embed_spec"]) == "P('tensor', 'fsdp')" and not bool(r["embed_fully_addressable"])
    spec, state = scenario.initial_state()
    assert_run_matches(r, multiprocess_run[1][0], scenario.flatten(state.params), max(spec.train.lr, spec.pipo.lr))


def test_data_is_loaded_and_scored_per_process(multiprocess_run):
    r = _result(multiprocess_run)
    rows = np.arange(24, dtype=np.float32).reshape(8, 3)
    np.testing.assert_array_equal(r["data_rows_slice"], [0, 4])  # process 0 loads rows 0..3 only
    np.testing.assert_array_equal(r["data_gathered"], rows)
    assert float(r["data_weighted_sum"]) == float(np.sum(rows * np.arange(8)[:, None]))  # 1344
    # each process scored its own rows; process 1 marked its scores with +1000
    np.testing.assert_array_equal(r["reward_gathered"], rows.sum(axis=1) + 1000 * (np.arange(8) >= 4))


def test_multihost_checkpoint_restores_in_every_process(multiprocess_run):
    r = _result(multiprocess_run)
    for target in ("same", "1x1x4"):
        assert bool(r[f"restore_{target}_layout"]) and bool(r[f"restore_{target}_equal"]), target


def test_multihost_checkpoint_restores_in_one_process(multiprocess_run):
    r = _result(multiprocess_run)
    spec, _ = scenario.initial_state()
    abstract = steps.abstract_train_state(spec)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
    ckpt = Checkpointer(str(multiprocess_run[0] / "ckpt"))
    try:
        assert ckpt.latest_step() == scenario.ITERATIONS
        restored = ckpt.restore(template)
    finally:
        ckpt.close()
    assert int(restored.step) == scenario.ITERATIONS
    for key, value in scenario.flatten(restored.params).items():
        np.testing.assert_array_equal(value, r[f"params{key}"], err_msg=key)
