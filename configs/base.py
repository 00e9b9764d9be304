"""The base ml-collections config every algorithm file starts from.

An algorithm is a config: `configs/<algo>.py:get_config(preset)` starts from
`algorithm_config(name, preset)` (this base at a size preset, `tiny`, `micro`, `qwen3_4b`,
`qwen3_8b`, with the estimator / loss / attribution the algorithm's registration declares) and
sets only what differs from those defaults (a method's own settings are declared with their defaults beside
its code, `config.loss.<method>` / `config.advantage.<method>`). Every key is overridable on the command line,
e.g. `--config=configs/grpo.py:tiny --config.pipo.enabled=true --config.pipo.lam=0.2`.
The keys, their defaults, descriptions and constraints are declared once, in
`pipo_jax/config/sections.py`; `base_config` builds the ml-collections config from them.
`pipo_jax.run.setup.train_spec` checks a config at start-up and names the key.
"""

from __future__ import annotations

import ml_collections

from pipo_jax.config import schema, sections
# The learner's registries: importing them pushes their names and settings sections into the schema
# (`pipo_jax/config/registry.py`), which imports none of them.
from pipo_jax.rl import algorithms, registry, spec  # noqa: F401
from pipo_jax.tasks import registry as task_registry  # noqa: F401

PRESETS = ("tiny", "micro", "qwen3_4b", "qwen3_8b")
# The authors' runs (JacckMa/pipo_verl, verl/trainer/config/experiments/math/*_pipo.yaml) on top of
# the paper preset of the same size; only configs/{grpo,gspo,dapo}.py have them.
AUTHORS_PRESETS = ("authors_qwen3_4b", "authors_qwen3_8b")


def base_config() -> ml_collections.ConfigDict:
    """Every key's default, from its one declaration in `pipo_jax/config/sections.py` (type, default,
    description, constraint; `--check_config` prints the descriptions)."""
    return schema.defaults(sections.RunConfig)


def algorithm_config(name: str, preset: str, variant: str = "none") -> ml_collections.ConfigDict:
    """The base config at the size `preset` (`apply_preset`) for the registered algorithm `name` (and its variant):
    `algorithm` and the estimator, policy loss and attribution its registration declares first
    (`rl/registry.py:Algorithm.defaults`); a `configs/<name>.py` then sets only what differs."""
    c = apply_preset(base_config(), preset)
    for dotted, value in registry.algorithm_variant(name, variant).defaults.items():
        *parents, leaf = dotted.split(".")
        node = c
        for part in parents:
            node = node[part]
        node[leaf] = value
    return c


def paper_preset(preset: str, algorithm: str) -> tuple[str, bool]:
    """(the size preset, whether the authors' settings go on top) for `preset`; `authors_*`
    presets exist for the algorithms with a run in the authors' release (grpo, gspo, dapo)."""
    if preset in AUTHORS_PRESETS and algorithm in ("grpo", "gspo", "dapo"):
        return preset[len("authors_"):], True
    return preset, False  # apply_preset rejects an authors' preset of another algorithm


def apply_authors(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The settings every authors' math run shares (README "paper setting vs authors' setting")."""
    c.pipo.compat = True  # every behaviour of their trainer (the DAPO preset turns one back off)
    c.advantage.std_ddof = 1  # torch.std in compute_grpo_outcome_advantage
    c.train.shuffle = False  # actor.shuffle: false: mini-batches in batch order
    c.eval.temperature = 0.7  # val_kwargs: n 1, temperature 0.7
    c.eval.samples = 1
    c.eval.ks = "1"
    return c


def apply_preset(c: ml_collections.ConfigDict, preset: str) -> ml_collections.ConfigDict:
    """Sets the run size: `tiny` (CPU main job), `micro` (tests), `qwen3_4b` / `qwen3_8b` (paper Table 5)."""
    if preset in AUTHORS_PRESETS:
        raise ValueError(f"preset {preset!r}: the authors' release has runs of grpo, gspo and dapo only")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; expected one of {PRESETS + AUTHORS_PRESETS}")
    if preset in ("tiny", "micro"):
        c.model.preset = "task_tiny"
        c.iterations = 200
        c.rollout.prompts_per_batch = 32
        c.train.mini_batch_prompts = 16
        c.train.lr = 1e-4  # alpha_std; the paper's 1e-6 is for 4B/8B models
        c.pipo.lr = 1e-4  # alpha_PI = alpha_std, as in the paper
        c.critic.lr = 1e-4
        c.vpd.lr = 1e-4
        c.eval.every = 20
    if preset == "tiny":
        # 2-digit '+'/'-': the base model learns from flawed demonstrations (65% of carrying /
        # borrowing answers with the column mistake), so greedy decoding solves about the
        # carry-free share (~40%) while sampling solves the rest ~35% of the time: mixed groups
        # for RL, and a gap that the verified reward closes. The warm-up also teaches reading
        # the SDPO / VPD teacher contexts (a sibling's solution; feedback revealing the answer).
        c.iterations = 100
        c.task.arithmetic.min_digits = 2
        c.task.arithmetic.feedback_style = "reveal"
        c.task.arithmetic.warmup_mistake_rate = 0.65  # the arithmetic task's own warm-up demonstrations
        c.task.arithmetic.warmup_context_fraction = 0.5
        c.warmup.steps = 1200
        c.warmup.target_accuracy = None
    if preset == "micro":
        c.model.preset = "task_micro"  # one layer: the tests compile their trainer programs faster
        c.iterations = 3
        c.task.arithmetic.reward_mode = "per_token"  # graded rewards: a random model still gets signal
        c.rollout.prompts_per_batch = 4
        c.rollout.group_size = 4
        c.train.mini_batch_prompts = 2
        c.pipo.window = 2
        c.warmup.steps = 2
        c.warmup.batch = 8
        c.warmup.target_accuracy = None
        c.eval.n = 16
        c.eval.every = 0
        c.eval.heldout_samples = 0  # the sampled held-out pass@1 and warm-up check: compiled where a test asks
        c.warmup.check_prompts = 0
        c.log.every = 1  # chunks of one iteration: a micro run of any length compiles one scan program
        c.log.progress = False
        c.log.plots = False
        c.log.tensorboard = False
    if preset in ("qwen3_4b", "qwen3_8b"):
        c.model.preset = preset
        c.model.path = ""  # must be set: --config.model.path=/path/to/Qwen3-4B
        c.model.param_dtype = "float32"  # fp32 masters, bf16 compute
        c.model.dtype = "bfloat16"
        c.model.remat = "full"
        c.warmup.enabled = False
        c.iterations = 500
        c.rollout.prompts_per_batch = 128
        c.rollout.group_size = 8
        c.rollout.max_new_tokens = 4096
        c.rollout.generate_rows_per_device = 8  # rows decoded per device per pass (KV cache 8 x 4608 positions)
        # per target platform: on TPU the bf16 weights gathered over fsdp once per generate call (8B: 16.4 GB
        # a chip), not by every decode step (15 GB of all-gathers a step on v5p-16); on a GPU sharded, where
        # gathered runs past the 48 GB budget (docs/scaling.md)
        c.rollout.decode_weights = "auto"
        c.train.mini_batch_prompts = 64
        c.train.micro_batch_size_per_device = 4
        c.train.lr = 1e-6
        c.pipo.lr = 1e-6
        c.eval.every = 25
        # Paper Table 5: MATH prompts (<= 512 tokens) verified on the host; set
        # --config.task.dataset.path=/data/math_train.jsonl (and eval.benchmarks for MATH500 etc.).
        c.task.name = "math"
        c.task.dataset.path = ""
        c.task.dataset.max_prompt_tokens = 512
        c.task.heldout_fraction = 0.02
        c.task.epochs = 3.0
        c.log.jit_loop = False
        c.log.every = 1
    return c
