"""The learner's registered methods: advantage estimators, policy losses, attributions, advantage
shapings and the algorithms that combine them, each declared once and looked up by name.

    ADVANTAGE_ESTIMATORS[name]: AdvantageEstimator   fn(spec, AdvantageInputs) -> (adv_br, returns_br | None)
                                                     (+ `carried`: a state across iterations, `estimate`)
                                                     (or + {TrainBatch field: array}: what its loss or attribution
                                                      reads, COPO's, ADORA's)
                                                     (+ `reward_components`: reads the task's, GDPO's)
    POLICY_LOSSES[name]:        PolicyLoss           fn(spec, params, teacher_params, mb, counts, *, hyper)
                                                         -> (loss, metrics, logp_br, entropy_br | None)
    ATTRIBUTIONS[name]:         Attribution          fn(spec, TrainBatch) -> attr_br
    ADVANTAGE_SHAPINGS[name]:   fn(spec, TrainBatch) -> adv_br
    ALGORITHMS[key]:            Algorithm            which of the above an algorithm may use (the first of each:
                                                     its defaults, `Algorithm.defaults`)

Register with the decorators (`@policy_loss("name", pi_ratio="token")`, ...) and
`register_algorithm(Algorithm(...))`; each also pushes its name into the config schema
(`config/registry.py`: the choices of `algorithm`, `advantage.estimator`, `loss.policy`,
`pipo.attribution`) and, for a method with settings of its own, its settings section
(`settings=`: a `config.schema.Section` at `loss.<name>` / `advantage.<name>`, declared beside the
method's math in `pipo_jax/losses/`). `rl/spec.py:TrainSpec` resolves the config's names here;
`rl/algorithms.py` registers the implementations (importing it fills these tables).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax

from pipo_jax.config import registry as config_registry


class AdvantageInputs(NamedTuple):
    """What an estimator may read: `[B, R]` float32 unless named."""

    mask_br: jax.Array
    token_rewards_br: jax.Array  # outcome (+ KL penalty) reward on each response token
    seq_rewards_b: jax.Array  # [B]: the sum of the token rewards
    values_br: Any = None  # the critic's values (estimators with `critic=True`)
    state: Any = None  # an estimator with `carried`: its state with this batch folded in (`estimate`)
    tokens_br: Any = None  # int32 [B, R]: the response tokens (COPO's outcomes)
    reward_components_bc: Any = None  # [B, C]: the task's reward components (estimators with `reward_components`)


class CarriedState(NamedTuple):
    """What an estimator carries across iterations, in `TrainState.estimator_state` (replicated):
    `init(spec)` its fresh pytree, every leaf zero (a checkpoint saved before the field existed restores
    it so, `run/checkpoint.py:ADDED_FIELDS`); `update(spec, state, AdvantageInputs) -> (state, metrics)`
    this batch folded in, before `fn` reads the result as `AdvantageInputs.state` (`estimate`)."""

    init: Callable
    update: Callable


@dataclasses.dataclass(frozen=True)
class AdvantageEstimator:
    name: str
    fn: Callable
    critic: bool = False  # reads `values_br` and trains PPO's value model
    group: bool = False  # normalises within each prompt's group of G responses (needs G >= 2)
    carried: CarriedState | None = None  # a state across iterations (BNPO's pool of success rates)
    reward_components: bool = False  # reads the task's reward components (`TaskCapabilities.reward_components`)


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    name: str
    fn: Callable
    pi_ratio: str = "token"  # the ratio of PIPO's PI surrogate when this loss is the base loss: token | sequence
    distills: bool = False  # a distillation toward the teacher, averaged over teacher-signal rows (`counts["sd"]`)
    dual_clip: bool = False  # reads `loss.clip_ratio_c` (a policy-gradient loss without it requires 0)


@dataclasses.dataclass(frozen=True)
class Attribution:
    name: str
    fn: Callable
    teacher: bool = False  # reads `logp_teacher_br` (recomputed after VPD's E-step changes the teacher)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """An algorithm: the names it may combine.

    estimators / policy_losses: the `advantage.estimator` / `loss.policy` values it accepts
    ("none": no advantages). A policy loss maps to the registered loss it trains with
    (`policy_losses` pairs), so a variant can swap the loss behind a config name (VPD's
    joint hybrid trains "token_clip" plus the distillation). attribution: the only
    `pipo.attribution` that fits. teacher: builds feedback-conditioned teacher contexts.
    authors_pi_token_loss: the authors' PI-loss variants (`pipo.authors.pi_no_lower_clip`,
    `pi_symmetric_clip`, their `grpo_layback`) apply; their PPO PI step is the plain clip.
    authors_ppo: the authors' PPO path (`ppo_layback`): `pipo.authors.ppo_pi_no_lam`,
    `ppo_sign_attribution` and `ppo_adv_gate` apply.
    config_name: the `config.algorithm` value it answers to ("" = `name`); variant: which of that
    name's registered variants it is, chosen by `vpd.hybrid` ("none": the plain one).
    vpd_settings: reads the `vpd` section (VPD's E-step and hybrids; `TrainSpec.vpd`).
    """

    name: str
    estimators: tuple[str, ...]
    policy_losses: tuple[tuple[str, str], ...]
    attribution: str
    teacher: bool = False
    advantage_shaping: str | None = None
    authors_pi_token_loss: bool = True
    authors_ppo: bool = False
    config_name: str = ""
    variant: str = "none"
    vpd_settings: bool = False

    def __post_init__(self):
        if not self.config_name:
            object.__setattr__(self, "config_name", self.name)

    @property
    def defaults(self) -> dict[str, str]:
        """The config keys its registration sets: {dotted key: value} (`configs/base.py:algorithm_config`)."""
        return {"algorithm": self.config_name, "advantage.estimator": self.estimators[0],
                "loss.policy": self.policy_losses[0][0], "pipo.attribution": self.attribution}

    def loss_for(self, policy: str) -> str | None:
        """The registered loss `loss.policy = policy` trains with, or None if it does not fit."""
        return dict(self.policy_losses).get(policy)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
POLICY_LOSSES: dict[str, PolicyLoss] = {}
ATTRIBUTIONS: dict[str, Attribution] = {}
ADVANTAGE_SHAPINGS: dict[str, Callable] = {}
ALGORITHMS: dict[str, Algorithm] = {}


def _register(table: dict, name: str, entry):
    if name in table:
        raise ValueError(f"{name!r} is registered twice")
    table[name] = entry
    return entry


def _register_settings(settings: type | None, parent: str, name: str) -> None:
    """Pushes a method's settings section (`config.<parent>.<name>`) into the config schema, used by the runs whose
    `config.<parent>.<key>` names it (`estimator` / `policy`)."""
    if settings is None:
        return
    if getattr(settings, "_section", "") != f"{parent}.{name}":
        raise ValueError(f"{parent} {name!r}: settings {settings.__name__} declare _section="
                         f"{getattr(settings, '_section', '')!r}, not {parent}.{name!r}")
    chooser = "advantage.estimator" if parent == "advantage" else "loss.policy"
    config_registry.register_section(settings, used_when=(chooser, name))


def advantage_estimator(*names: str, critic: bool = False, group: bool = False, carried: CarriedState | None = None,
                        reward_components: bool = False, settings: type | None = None):
    """Registers `fn(spec, AdvantageInputs) -> (adv_br, returns_br | None)` under each of `names`;
    `critic`: reads the critic's values (the `critic` section is then this estimator's runs'); `group`:
    group-relative (G >= 2 checked by `TrainSpec`); `carried`: the state it keeps across iterations
    (`CarriedState`); `reward_components`: reads the task's reward components
    (`AdvantageInputs.reward_components_bc`; `TrainSpec` checks the task has them); `settings`: its own keys, a
    `config.schema.Section` at `advantage.<name>` (read as `spec.advantage.<name>.<key>`)."""
    def register(fn):
        entry = AdvantageEstimator(names[0], fn, critic, group, carried, reward_components)
        for name in names:
            _register(ADVANTAGE_ESTIMATORS, name, entry)
            if critic:
                config_registry.register_use("critic", "advantage.estimator", name)
        config_registry.register_names("estimator", *names)
        _register_settings(settings, "advantage", names[0])
        return fn
    return register


def policy_loss(name: str, *, pi_ratio: str = "token", distills: bool = False, dual_clip: bool = False,
                settings: type | None = None):
    """Registers `fn(spec, params, teacher_params, mb, counts) -> (loss, metrics, logp_br, entropy_br)`;
    `settings`: its own keys, a `config.schema.Section` at `loss.<name>` (read as `spec.loss.<name>.<key>`)."""
    if pi_ratio not in ("token", "sequence"):
        raise ValueError(f"policy loss {name!r}: pi_ratio {pi_ratio!r} is not 'token' or 'sequence'")
    _register_settings(settings, "loss", name)
    return lambda fn: _register(POLICY_LOSSES, name, PolicyLoss(name, fn, pi_ratio, distills, dual_clip)) and fn


def attribution(name: str, *, teacher: bool = False):
    """Registers `fn(spec, TrainBatch) -> attr_br` (zero at padding)."""
    config_registry.register_names("attribution", name)
    return lambda fn: _register(ATTRIBUTIONS, name, Attribution(name, fn, teacher)) and fn


def advantage_shaping(name: str):
    """Registers `fn(spec, TrainBatch) -> adv_br`, applied to the estimator's advantages."""
    return lambda fn: _register(ADVANTAGE_SHAPINGS, name, fn)


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Adds `algorithm` (its estimators, losses, attribution and shaping registered before it)."""
    for est in algorithm.estimators:
        if est != "none" and est not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"algorithm {algorithm.name!r}: unknown estimator {est!r}")
    for _, loss in algorithm.policy_losses:
        if loss not in POLICY_LOSSES:
            raise ValueError(f"algorithm {algorithm.name!r}: unknown policy loss {loss!r}")
    if algorithm.attribution not in ATTRIBUTIONS:
        raise ValueError(f"algorithm {algorithm.name!r}: unknown attribution {algorithm.attribution!r}")
    if algorithm.advantage_shaping is not None and algorithm.advantage_shaping not in ADVANTAGE_SHAPINGS:
        raise ValueError(f"algorithm {algorithm.name!r}: unknown advantage shaping {algorithm.advantage_shaping!r}")
    _register(ALGORITHMS, algorithm.name, algorithm)
    # the config's choices: `algorithm`, `loss.policy` (the names an algorithm accepts), "none" of `advantage.estimator`
    config_registry.register_names("algorithm", algorithm.config_name)
    config_registry.register_names("policy", *(name for name, _ in algorithm.policy_losses))
    config_registry.register_names("estimator", *(e for e in algorithm.estimators if e == "none"))
    # the sections only some algorithms' runs read (`--check_config` lists them for those)
    if algorithm.teacher:
        config_registry.register_use("sdpo", "algorithm", algorithm.config_name)
    if algorithm.vpd_settings:
        config_registry.register_use("vpd", "algorithm", algorithm.config_name)
    return algorithm


def group_estimators() -> tuple[str, ...]:
    """The names of the registered estimators declared `group=True`."""
    return tuple(name for name, est in ADVANTAGE_ESTIMATORS.items() if est.group)


def config_names() -> tuple[str, ...]:
    """The `config.algorithm` values: each registered algorithm's `config_name`, once."""
    return tuple(dict.fromkeys(a.config_name for a in ALGORITHMS.values()))


def plain_algorithm(config_name: str) -> Algorithm:
    """The registered algorithm `config.algorithm = config_name` names without a variant."""
    return next(a for a in ALGORITHMS.values() if a.config_name == config_name and a.variant == "none")


def algorithm_variant(config_name: str, variant: str = "none") -> Algorithm:
    """The registered algorithm of `config.algorithm` and its variant (VPD's hybrids: `vpd.hybrid`)."""
    return next(a for a in ALGORITHMS.values() if a.config_name == config_name and a.variant == variant)
