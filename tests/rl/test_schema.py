"""The config schema (`config/schema.py`, `config/sections.py`): every key declared once with its type,
default, description and constraint; `base_config` built from the declarations; the generic
`from_config` round-trips; choices read from the registries."""

import importlib
import json
import pathlib

import ml_collections
import pytest

from configs import base
from pipo_jax.config import registry, schema, sections
from pipo_jax.config.sections import ConfigError, RunConfig
from pipo_jax.rl import algorithms
from experiments.train import check_config_listing
from pipo_jax.run.workdir import flat_config
from tests.typed import spec_of

ALGOS = registry.names("algorithm")  # each registered algorithm has its configs/<name>.py


def test_every_key_has_exactly_one_declaration_with_a_description():
    declared = schema.declarations(RunConfig)
    keys = list(flat_config(json.loads(base.base_config().to_json_best_effort())))
    assert keys == list(declared)  # the same keys, once each, in declaration order
    assert len(keys) == len(set(keys)) > 150
    missing = [k for k, f in declared.items() if not f.metadata.get("doc")]
    assert not missing, f"keys without a description: {missing}"


def test_base_config_defaults_are_the_declared_defaults():
    flat = flat_config(json.loads(base.base_config().to_json_best_effort()))
    for name, f in schema.declarations(RunConfig).items():
        assert flat[name] == f.default and type(flat[name]) is type(f.default), name
    c = base.base_config()
    assert c.rollout.max_new_tokens == 0 and isinstance(c.task.epochs, float) and c.pipo.pi_clip_low is None
    # a None default is a typed placeholder: the command line parses it as its type
    c.pipo.authors.window_twice = False
    with pytest.raises(TypeError):
        c.pipo.authors.window_twice = "no"


@pytest.mark.parametrize("algo", ALGOS)
def test_from_config_round_trips(algo):
    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    run = RunConfig.from_config(c)
    assert schema.to_config(run) == json.loads(c.to_json())
    assert RunConfig.from_config(ml_collections.ConfigDict(schema.to_config(run))) == run
    assert hash(run) == hash(RunConfig.from_config(c))  # frozen and hashable (jit-static)
    spec = spec_of(c)
    for name in ("rollout", "train", "advantage", "loss", "critic", "dapo", "sdpo", "pipo"):
        section = getattr(spec, name)
        assert type(section).from_config(schema.to_config(section)) == section, name


def test_fields_are_named_as_their_keys():
    spec = spec_of(importlib.import_module("configs.dapo").get_config("micro"))
    c = importlib.import_module("configs.dapo").get_config("micro")
    # the spec resolves the "0 = default" keys; every other field is its key's value
    assert spec.rollout.max_new_tokens == spec.task.answer_len and c.rollout.max_new_tokens == 0
    assert spec.dapo.gen_prompts_per_batch == c.rollout.prompts_per_batch
    assert spec.train.mini_batch_prompts == c.train.mini_batch_prompts
    assert spec.mini_batch == c.train.mini_batch_prompts * c.rollout.group_size
    assert spec.train.micro_batch_size_per_device == c.train.micro_batch_size_per_device


def test_reading_a_section():
    loss = sections.LossConfig.from_config({"clip_high": 1, "kl_coef": 0})
    assert loss.clip_high == 1.0 and isinstance(loss.clip_high, float) and isinstance(loss.kl_coef, float)
    assert loss.policy == "token_clip"  # a key the config lacks (a config stored by an older release): its default
    with pytest.raises(ConfigError, match=r"config\.loss\.kl_coeff: unknown key; expected one of \('policy', "):
        sections.LossConfig.from_config({"kl_coeff": 0.1})
    with pytest.raises(ConfigError, match=r"config\.train\.micro_batch_size: the global micro-batch is gone"):
        sections.TrainConfig.from_config({"micro_batch_size": 4})
    with pytest.raises(ConfigError, match=r"config\.rollout\.group_size: 2\.5 must be an integer$"):
        sections.RolloutConfig(group_size=2.5)
    with pytest.raises(ConfigError, match=r"config\.log\.jit_loop: 'yes' must be True or False$"):
        sections.LogConfig(jit_loop="yes")
    with pytest.raises(ConfigError, match=r"config\.pipo\.pi_clip_low: 'a' must be a finite number or None$"):
        sections.PipoConfig(pi_clip_low="a")
    with pytest.raises(ConfigError, match=r"config\.pipo\.authors: 3 must be a section$"):
        sections.PipoConfig.from_config({"authors": 3})


@pytest.mark.parametrize("key, value, message", [
    ("iterations", 0, r"config\.iterations: 0 must be >= 1$"),
    ("log.every", 0, r"config\.log\.every: 0 must be >= 1$"),
    ("checkpoint.keep", 0, r"config\.checkpoint\.keep: 0 must be >= 1$"),
    ("eval.ks", "1,x", r"config\.eval\.ks: '1,x' is not a comma-separated list of integers$"),
    ("eval.ks", "1,8", r"config\.eval\.ks: \(1, 8\): each k must be in \[1, eval\.samples=4\]$"),
    ("task.arithmetic.warmup_mistake_rate", 1.5, r"config\.task\.arithmetic\.warmup_mistake_rate: 1\.5 must be in \[0, 1\]$"),
    ("distributed.mode", "maybe", r"config\.distributed\.mode: 'maybe' is not one of \('auto', 'on', 'off'\)$"),
    ("model.remat", "some", r"config\.model\.remat: 'some' is not one of \('none', 'full', 'dots_saveable'\)$"),
    ("task.epochs", -1.0, r"config\.task\.epochs: -1\.0 must be >= 0$"),
])
def test_run_level_keys_are_checked_by_their_declaration(key, value, message):
    c = base.apply_preset(base.base_config(), "micro")
    *path, name = key.split(".")
    node = c
    for part in path:
        node = node[part]
    node[name] = value
    with pytest.raises(ConfigError, match=message):
        spec_of(c)


def test_choices_come_from_the_registries():
    docs = {name: doc for name, _, doc in schema.describe(RunConfig, base.base_config())}
    assert docs["algorithm"].endswith(f"[{' | '.join(registry.names('algorithm'))}]")
    assert "dr_grpo" in registry.names("algorithm") and "vpd+joint" not in registry.names("algorithm")
    assert {"rloo", "reinforce_pp", "kl_cov", "clip_cov", "bnpo", "copo", "riskpo", "gdpo",
            "adora"} <= set(registry.names("algorithm"))
    assert {"kl_cov", "clip_cov", "drpo", "bapo", "disco", "copo"} <= set(registry.names("policy"))
    assert "cispo" in docs["loss.policy"] and set(registry.names("policy")) >= {"token_clip", "gspo", "cispo"}
    assert docs["advantage.estimator"].endswith(f"[{' | '.join(list(algorithms.ADVANTAGE_ESTIMATORS) + ['none'])}]")
    assert docs["pipo.attribution"].endswith("[group | gae | copo | adora | sdpo_token]")
    assert docs["pipo.authors.window_twice"].startswith("mu_t enters the window before xi is computed")


def test_a_registered_choice_is_checked_when_the_config_is_validated(monkeypatch):
    # the schema imports no registry: a name pushed after its sections were declared is a valid choice
    with pytest.raises(ConfigError, match=r"^config\.model\.attention_impl: 'ring' is not one of \('auto', "):
        sections.ModelConfig(attention_impl="ring")
    monkeypatch.setitem(registry._NAMES, "attention_impl", {**registry._NAMES["attention_impl"], "ring": None})
    assert sections.ModelConfig(attention_impl="ring").attention_impl == "ring"
    with pytest.raises(RuntimeError, match=r"^no no_such_kind is registered: import the module that registers"):
        registry.names("no_such_kind")


# The sections only some runs read: each method's own settings, PPO's critic, the teacher's and VPD's, each task's.
METHOD_SECTIONS = ("loss.kl_cov", "loss.clip_cov", "loss.drpo", "loss.bapo", "loss.disco", "advantage.bnpo",
                   "advantage.copo", "advantage.riskpo", "advantage.adora")
RUN_SECTIONS = ("critic", "sdpo", "vpd") + tuple(f"task.{t}" for t in ("arithmetic", "dataset", "math", "code",
                                                                         "reasoning_gym", "digit_sum"))


def _listed(algo: str) -> set[str]:
    c = importlib.import_module(f"configs.{algo}").get_config("micro")
    spec_of(c)
    return {line.split(" = ", 1)[0] for line in check_config_listing(c).splitlines()}


def _sections_of(keys) -> set[str]:
    return {s for s in METHOD_SECTIONS + RUN_SECTIONS for k in keys if k.startswith(s + ".")}


def test_check_config_lists_the_shared_keys_and_the_runs_own():
    declared = schema.declarations(RunConfig)
    assert _sections_of(declared) == set(METHOD_SECTIONS + RUN_SECTIONS)  # every one of them is declared
    shared = {k for k in declared if not _sections_of([k])}
    grpo = _listed("grpo")  # GRPO on the arithmetic task: the shared keys and the arithmetic task's, nothing else
    assert grpo == shared | {k for k in declared if k.startswith("task.arithmetic.")}
    assert len(grpo) < len(declared) - 60
    for algo, own in [("bapo", {"loss.bapo"}), ("kl_cov", {"loss.kl_cov"}), ("clip_cov", {"loss.clip_cov"}),
                      ("drpo", {"loss.drpo"}), ("disco", {"loss.disco"}), ("bnpo", {"advantage.bnpo"}),
                      ("copo", {"advantage.copo"}), ("riskpo", {"advantage.riskpo"}), ("adora", {"advantage.adora"}),
                      ("ppo", {"critic"}), ("sdpo", {"sdpo"}), ("vpd", {"sdpo", "vpd"})]:
        listed = _listed(algo)
        assert _sections_of(listed) == own | {"task.arithmetic"}, algo
        assert {k for k in declared if any(k.startswith(s + ".") for s in own)} <= listed, algo


def test_a_methods_settings_are_checked_where_declared_and_old_keys_are_moved():
    c = importlib.import_module("configs.bapo").get_config("micro")
    assert spec_of(c).loss.bapo.rho == 0.4  # the declared default, not restated by configs/bapo.py
    c.loss.bapo.upper_max = 1.1
    with pytest.raises(ConfigError, match=r"^config\.loss\.bapo\.upper_max: 1\.1 must be >= loss\.bapo\.upper_start"):
        spec_of(c)
    # a run config stored before the move is read with the keys at their new place
    stored = {"loss": {"bapo_rho": 0.3, "drpo_lambda": 0.2}, "advantage": {"copo_blend": "soft"}}
    assert schema.moved_keys(stored) == {"loss": {"bapo": {"rho": 0.3}, "drpo": {"lam": 0.2}},
                                         "advantage": {"copo": {"blend": "soft"}}}
    assert schema.unknown_key(RunConfig, "loss.bapo_rho", prefix="--config.") == "moved: set --config.loss.bapo.rho"


def test_an_algorithm_config_states_only_what_differs_from_its_registration():
    for algo in ALGOS:
        source = (pathlib.Path(base.__file__).parent / f"{algo}.py").read_text()
        assert f'base.algorithm_config("{algo}"' in source, algo
        defaults = algorithms.plain_algorithm(algo).defaults
        for dotted, value in defaults.items():
            assert f'c.{dotted} = "{value}"' not in source, (algo, dotted)  # the registration says it
        c = importlib.import_module(f"configs.{algo}").get_config("micro")
        assert (c.algorithm, c.pipo.attribution) == (algo, defaults["pipo.attribution"])
