"""Config: validation of learning rates / weight decay, DAPO's generation batch, the authors'
PIPO behaviours and presets (README "paper setting vs authors' setting")."""

import pytest

from configs import base, dapo, grpo, gspo, ppo, sdpo
from pipo_jax.config.sections import PipoConfig
from pipo_jax.rl import controller
from pipo_jax.rl.spec import ConfigError
from tests.rl.test_config import check_config_values
from tests.scripts import run_script
from tests.typed import spec_of


@pytest.mark.parametrize("key, value, message", [
    ("critic.lr", -1e-5, r"config.critic.lr: -1e-05 must be > 0"),
    ("warmup.lr", -3e-3, r"config.warmup.lr: -0.003 must be > 0"),
    ("warmup.eval_every", 0, r"config.warmup.eval_every: 0 must be >= 1"),
    ("train.weight_decay", -0.01, r"config.train.weight_decay: -0.01 must be >= 0"),
    ("pipo.authors.clamp", True, r"config.pipo.authors.clamp: unknown key; expected one of \('window_twice'"),
    ("pipo.attribution_norm", "l2", r"config.pipo.attribution_norm: 'l2' is not one of \('none', 'mean_abs'\)"),
    ("pipo.pi_optimizer", "adam", r"config.pipo.pi_optimizer: 'adam' is not one of \('shared', 'separate'\)"),
    ("pipo.pi_ratio", "sequence", r"config.pipo.pi_ratio: 'sequence' is not one of \('base', 'token'\)"),
    ("pipo.pi_clip_high", -0.1, r"config.pipo.pi_clip_high: -0.1 must be None \(the base loss's clip\) or > 0"),
    ("pipo.sdpo_pi_denominator", "rows", r"config.pipo.sdpo_pi_denominator: 'rows' is not one of"),
])
def test_bad_values_name_the_key(key, value, message):
    c = ppo.get_config("micro")
    *sections, name = key.split(".")
    target = c
    for section in sections:
        target = target[section]
    target[name] = value
    with pytest.raises(ConfigError, match=message):
        spec_of(c)


def test_dapo_generation_batch_follows_a_batch_override():
    c = dapo.get_config("micro")
    c.rollout.prompts_per_batch = 8  # as --config.rollout.prompts_per_batch=8 would
    assert spec_of(c).dapo.gen_prompts_per_batch == 8
    c.dapo.gen_prompts_per_batch = 12
    assert spec_of(c).dapo.gen_prompts_per_batch == 12


def test_authors_behaviours_one_by_one_and_all():
    c = grpo.get_config("micro")
    assert spec_of(c).pipo_options == controller.PipoOptions()
    c.pipo.authors.rhat_clamp = True
    assert spec_of(c).pipo_options == controller.PipoOptions(rhat_clamp=True)
    c.pipo.compat = True
    assert all(spec_of(c).pipo_options)
    assert sorted(c.pipo.authors) == sorted(controller.AUTHORS_BEHAVIOURS)


def test_authors_presets():
    g = grpo.get_config("authors_qwen3_4b")
    assert (g.rollout.temperature, g.rollout.top_p, g.loss.agg_mode) == (0.7, 0.95, "token-mean")
    assert (g.advantage.std_ddof, g.pipo.compat, g.loss.kl_coef, g.train.shuffle) == (1, True, 0.001, False)
    assert (g.model.preset, g.rollout.prompts_per_batch, g.train.mini_batch_prompts) == ("qwen3_4b", 128, 64)
    s = gspo.get_config("authors_qwen3_8b")
    assert (s.loss.kl_coef, s.rollout.temperature, s.rollout.top_p, s.loss.agg_mode) == (
        0.0, 1.0, 1.0, "seq-mean-token-mean")
    assert (s.advantage.std_ddof, s.pipo.compat, s.model.preset) == (1, True, "qwen3_8b")
    d = dapo.get_config("authors_qwen3_4b")
    assert (d.loss.clip_low, d.loss.clip_high, d.loss.clip_ratio_c, d.loss.kl_coef) == (0.2, 0.28, 10.0, 0.001)
    options = controller.options_of(PipoConfig.from_config(d.pipo))  # every behaviour of their code but the double push
    assert d.pipo.compat and {k for k, v in options._asdict().items() if not v} == {"window_twice"}
    assert d.task.epochs == 9.0 and d.advantage.std_ddof == 1
    for module in (ppo, sdpo):
        with pytest.raises(ValueError, match="the authors' release has runs of grpo, gspo and dapo only"):
            module.get_config("authors_qwen3_4b")
    with pytest.raises(ValueError, match="unknown preset 'authors_tiny'"):
        grpo.get_config("authors_tiny")
    assert base.AUTHORS_PRESETS == ("authors_qwen3_4b", "authors_qwen3_8b")


@pytest.mark.parametrize("compat, named, expected_off", [
    (True, {"window_twice": False}, {"window_twice"}),  # a named false wins over compat
    (True, {}, set()),
    (False, {"std_ddof0": True}, set(controller.AUTHORS_BEHAVIOURS) - {"std_ddof0"}),
    (False, {}, set(controller.AUTHORS_BEHAVIOURS)),
    # the authors' PPO and verl behaviours, one by one
    (True, {"ppo_pi_no_lam": False}, {"ppo_pi_no_lam"}),
    (True, {"ppo_sign_attribution": False, "ppo_adv_gate": False}, {"ppo_sign_attribution", "ppo_adv_gate"}),
    (False, {"micro_token_mean": True}, set(controller.AUTHORS_BEHAVIOURS) - {"micro_token_mean"}),
    (False, {"ppo_adv_gate": True}, set(controller.AUTHORS_BEHAVIOURS) - {"ppo_adv_gate"}),
])
def test_a_named_authors_behaviour_wins_over_compat(compat, named, expected_off):
    c = grpo.get_config("micro")
    c.pipo.compat = compat
    for k, v in named.items():
        c.pipo.authors[k] = v
    options = spec_of(c).pipo_options
    assert {k for k, v in options._asdict().items() if not v} == expected_off


def test_an_unset_authors_behaviour_is_set_from_the_command_line():
    res = run_script("-m", "experiments.train", "--check_config", "--config=configs/grpo.py:micro",
                     "--config.pipo.compat=true", "--config.pipo.authors.window_twice=false")
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout
    values = check_config_values(out)
    assert values["pipo.authors.window_twice"] is False and values["pipo.authors.std_ddof0"] is None
