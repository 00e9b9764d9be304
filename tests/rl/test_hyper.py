"""Hyperparameters as data (`rl/hyper.py`): configs that differ only in a `HYPER_KEYS` value have equal specs
and one program, whose members of a vmapped stack each train with their own values; a restore takes them
from the run's config."""

import dataclasses
import importlib
from typing import Any

import flax
import jax
import numpy as np
import pytest

from configs import vpd
from experiments import compare
from pipo_jax.models import qwen3
from pipo_jax.rl import hyper, loop
from pipo_jax.rl.spec import ConfigError
from pipo_jax.rl.state import TrainState, init_train_state
from pipo_jax.run import sharded_steps
from pipo_jax.run.checkpoint import Checkpointer
from pipo_jax.run.placement import Placement
from pipo_jax.run.setup import train_spec
from tests.conftest import override

# A value for every hyperparameter key other than configs/grpo.py:micro's (with loss.entropy_coef 0.001 there).
CHANGED = {"train.lr": 3e-4, "critic.lr": 2e-5, "pipo.lr": 2e-4, "vpd.lr": 5e-5, "pipo.lam": 0.5, "loss.clip_low": 0.1,
           "loss.clip_high": 0.3, "pipo.pi_clip_low": 0.15, "pipo.pi_clip_high": 0.25, "loss.clip_ratio_c": 2.0,
           "loss.kl_coef": 0.01, "loss.entropy_coef": 0.002}
FIELD = {"train.lr": "lr", "critic.lr": "critic_lr", "pipo.lr": "pi_lr", "vpd.lr": "vpd_lr", "pipo.lam": "lam",
         "loss.clip_low": "clip_low", "loss.clip_high": "clip_high", "pipo.pi_clip_low": "pi_clip_low",
         "pipo.pi_clip_high": "pi_clip_high", "loss.clip_ratio_c": "clip_ratio_c", "loss.kl_coef": "kl_coef",
         "loss.entropy_coef": "entropy_coef"}


def config(algo: str = "grpo", **overrides):
    """`configs/<algo>.py:micro` with PIPO and `overrides` (`vpd_joint`: VPD's joint hybrid)."""
    c = vpd.hybrid("micro", "joint") if algo == "vpd_joint" else importlib.import_module(
        f"configs.{algo}").get_config("micro")
    c.pipo.enabled = True
    return override(c, overrides)


def grpo_with_entropy(**overrides):
    return config("grpo", **{"loss.entropy_coef": 0.001, **overrides})


def test_configs_differing_in_one_hyperparameter_have_equal_specs():
    assert set(CHANGED) == set(hyper.HYPER_KEYS) == set(FIELD)
    for key, value in CHANGED.items():
        make = (lambda **o: config("vpd", **o)) if key == "vpd.lr" else grpo_with_entropy
        base = train_spec(make())
        spec = train_spec(make(**{key: value}))
        assert spec == base and hash(spec) == hash(base), key
        section, name = key.split(".")
        assert getattr(getattr(spec, section), name) == value  # the spec still holds the config's value
        h0, h = hyper.hyperparameters_of(base), hyper.hyperparameters_of(spec)
        # the changed key's field alone differs (and the PI step's clip, unset: the base loss's), float32
        fields = {FIELD[key]} | ({"pi_" + FIELD[key]} if key in ("loss.clip_low", "loss.clip_high") else set())
        for field in FIELD.values():
            want = np.float32(value) if field in fields else np.asarray(getattr(h0, field))
            assert np.asarray(getattr(h, field)).dtype == np.float32
            assert np.asarray(getattr(h, field)) == want, (key, field)
    h0 = hyper.hyperparameters_of(train_spec(grpo_with_entropy()))
    # unset, the PI step's clip is the base loss's; no VPD teacher: its learning rate 0
    assert float(h0.pi_clip_low) == np.float32(0.2) and float(h0.pi_clip_high) == np.float32(0.2)
    assert float(h0.vpd_lr) == 0.0


@pytest.mark.parametrize("key", hyper.SWITCHED_BY_ZERO)
def test_switching_a_term_off_is_structure(key):
    """0 switches the dual clip, the KL term or the entropy bonus off: a different program, a different spec."""
    assert train_spec(grpo_with_entropy(**{key: 0.0})) != train_spec(grpo_with_entropy())


def test_other_keys_stay_static_and_values_are_still_checked():
    base = train_spec(config())
    for key, value in (("pipo.window", 3), ("rollout.temperature", 0.7), ("rollout.group_size", 2)):
        assert train_spec(config(**{key: value})) != base, key
    with pytest.raises(ConfigError, match=r"^config\.loss\.clip_low: 1\.5 must be in \[0, 1\)$"):
        train_spec(config(**{"loss.clip_low": 1.5}))
    with pytest.raises(ConfigError, match=r"^config\.pipo\.lam: 2\.0 must be in \[0, 1\]$"):
        train_spec(config(**{"pipo.lam": 2.0}))


def _every_value_changed(algo: str, **overrides):
    """(config, the same config with every hyperparameter changed that is not 0: a zero is structure)."""
    c = config(algo, **overrides)
    changed = {}
    for key, value in CHANGED.items():
        section, name = key.split(".")
        if not (key in hyper.SWITCHED_BY_ZERO and c[section][name] == 0):
            changed[key] = value
    return c, config(algo, **{**overrides, **changed})


def _iteration_program(spec, abstract_state) -> str:
    return jax.jit(lambda s: loop.iteration(spec, s)).lower(abstract_state).as_text()


@pytest.mark.parametrize("algo,overrides", [
    ("grpo", {"loss.entropy_coef": 0.001}), ("grpo", {"pipo.pi_optimizer": "separate", "pipo.compat": True}),
    ("ppo", {}), ("dapo", {}), ("gspo", {}), ("grpo", {"loss.policy": "cispo", "loss.clip_ratio_c": 0.0}),
    ("copo", {}), ("clip_cov", {}), ("sdpo", {}), ("vpd_joint", {}), ("adora", {}),
], ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "-")
def test_no_hyperparameter_value_is_read_from_the_spec(algo, overrides):
    """One whole iteration (sample, reward, PIPO's PI step, the base and critic steps) lowered for two specs
    whose hyperparameters all differ is the same program, constant for constant: nothing reads a value from
    the spec. Every policy loss that takes a clip, the critic, the PI step's two optimizer forms."""
    a, b = (train_spec(c) for c in _every_value_changed(algo, **overrides))
    assert a == b and a.train.lr != b.train.lr
    state = sharded_steps.abstract_train_state(a)
    assert _iteration_program(a, state) == _iteration_program(b, state)


def test_the_lowered_program_shows_a_value_read_from_the_spec():
    """The check above can fail: with the hyperparameters taken from each spec as constants, the two
    lowered iterations differ."""
    a, b = (train_spec(c) for c in _every_value_changed("grpo"))
    state = sharded_steps.abstract_train_state(a)

    def baked(spec):
        return jax.jit(lambda s: loop.iteration(spec, s.replace(hyper=hyper.hyperparameters_of(spec)))).lower(
            state).as_text()

    assert baked(a) != baked(b)


MEMBERS = [{}, {"train.lr": 3e-4, "loss.kl_coef": 0.01},
           {"pipo.lam": 0.5, "pipo.lr": 2e-4, "loss.clip_low": 0.1, "loss.clip_high": 0.3,
            "loss.clip_ratio_c": 2.0}]


@pytest.mark.slow  # the iteration compiled twice, vmapped and alone
def test_a_vmapped_stack_of_hyperparameters_equals_separate_runs_on_one_program():
    """Three members from one base model and seed, differing in train.lr / kl_coef / lam / pipo.lr / clips /
    dual clip, advance as one vmapped program (`compare.vmapped_chunk`, the spec of the first); each equals
    its own run alone, which reuses one compiled program for all three (no retrace)."""
    configs = [config(**{"pipo.window": 2, **m}) for m in MEMBERS]
    specs = [train_spec(c) for c in configs]
    assert all(s == specs[0] for s in specs)
    params = jax.device_get(qwen3.init_params(specs[0].model, jax.random.PRNGKey(7)))  # host: never donated
    states = [init_train_state(s, jax.device_put(params), 3) for s in specs]
    n = 4
    together, m_together = compare.vmapped_chunk(specs[0], compare.stack(states), n)
    before = loop.scan_chunk._cache_size()
    alone = []
    for i, spec in enumerate(specs):
        alone.append(loop.scan_chunk(spec, init_train_state(spec, jax.device_put(params), 3), n))
        if i == 0:
            compiled = loop.scan_chunk._cache_size()
            assert compiled == before + 1
    assert loop.scan_chunk._cache_size() == compiled  # members 1 and 2: the program of member 0
    assert float(np.sum(m_together["pi_step_applied"])) > 0  # the PI step ran (its lr, lam and clip acted)
    steps = n * (specs[0].batch // specs[0].mini_batch) * 2  # base and PI optimizer steps
    atol = 2 * max(c.train.lr for c in configs) * steps  # as tests/test_compare.py: batched vs unbatched matmuls
    for i, (state_i, m_i) in enumerate(alone):
        np.testing.assert_array_equal(m_together["reward_mean"][i], m_i["reward_mean"])
        np.testing.assert_array_equal(m_together["pi_step_applied"][i], m_i["pi_step_applied"])
        np.testing.assert_array_equal(np.asarray(together.hyper.lr[i]), np.float32(configs[i].train.lr))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=0, atol=atol),
                     jax.device_get(together.params), jax.device_get(state_i.params))
    # the values acted: member 1 (3x the learning rate) moved further from the shared start than member 0, and
    # member 2 (lam, PI lr, clips) ended elsewhere
    leaves, start = jax.tree.leaves(jax.device_get(together.params)), jax.tree.leaves(params)
    moved = [sum(float(np.abs(a[i] - b).sum()) for a, b in zip(leaves, start)) for i in range(3)]
    assert moved[1] > 1.5 * moved[0], moved
    assert max(float(np.max(np.abs(a[2] - a[0]))) for a in leaves) > 1e-4


def test_a_restore_sets_the_hyperparameters_from_the_runs_config(tmp_path):
    """A checkpoint saved under one config restores (`Placement.restore`) with the hyperparameters of the
    config it resumes with, the rest as saved; one saved before `TrainState.hyper` existed restores the same."""

    @flax.struct.dataclass
    class FormerTrainState:  # TrainState's fields before hyper
        step: Any
        params: Any
        opt_state: Any
        ref_params: Any
        critic: Any
        teacher_params: Any
        pipo: Any
        rng: Any
        teacher_opt_state: Any = None
        vpd_delta: Any = None
        pi_opt_state: Any = None
        estimator_state: Any = None

    assert [f.name for f in dataclasses.fields(TrainState)] == [
        f.name for f in dataclasses.fields(FormerTrainState)] + ["hyper"]
    spec = train_spec(config())
    resumed = train_spec(config(**{"train.lr": 3e-4, "pipo.lam": 0.5}))
    state = init_train_state(spec, qwen3.init_params(spec.model, jax.random.PRNGKey(1)), 1)
    state = state.replace(step=state.step + 4)
    for name, saved in (("current", state), ("former", FormerTrainState(
            **{f.name: getattr(state, f.name) for f in dataclasses.fields(FormerTrainState)}))):
        ckpt = Checkpointer(str(tmp_path / name), keep=1)
        ckpt.save(4, saved)
        ckpt.wait()
        restored = Placement().restore(ckpt, resumed)
        ckpt.close()
        want = state.replace(hyper=hyper.hyperparameters_of(resumed))
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(want))
        assert float(restored.hyper.lr) == np.float32(3e-4) and float(restored.hyper.lam) == np.float32(0.5), name


def test_every_presets_clip_bounds_in_float32_equal_the_former_constants():
    """The ratio clip's bounds 1 - eps_low and 1 + eps_high are computed in the program in float32 from the
    float32 eps (data); as Python floats they were folded in float64 and then rounded. The two agree for every
    clip value of every algorithm's presets, so their numerics are those of the constants (for some other
    values, e.g. eps_high = 0.18, float32 gives the bound one ulp away)."""
    from configs import base
    from pipo_jax.rl import algorithms

    f32 = np.float32
    assert f32(1) + f32(0.18) != f32(1 + 0.18)  # the difference exists: the check below can fail
    checked = set()
    for algo in algorithms.config_names():
        module = importlib.import_module(f"configs.{algo}")
        for preset in base.PRESETS + base.AUTHORS_PRESETS:
            try:
                c = module.get_config(preset)
            except ValueError:  # an authors' preset of an algorithm without an authors' run
                continue
            for low in (c.loss.clip_low, c.pipo.pi_clip_low):
                if low is not None:
                    checked.add(low)
                    assert f32(1) - f32(low) == f32(1 - low), (algo, preset, low)
            symmetric = (c.loss.clip_low, c.pipo.pi_clip_low) if c.pipo.compat else ()  # the authors' PI clip
            for high in (c.loss.clip_high, c.pipo.pi_clip_high) + symmetric:  # 1 + eps_high, or 1 + eps_low
                if high is not None:
                    checked.add(high)
                    assert f32(1) + f32(high) == f32(1 + high), (algo, preset, high)
    assert {0.2, 0.28, 3e-4, 4e-4} <= checked
