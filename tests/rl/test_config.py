"""Config files, presets, command-line style overrides and start-up validation."""

import importlib
import json
import pathlib

import pytest

from pipo_jax.config.sections import RunConfig
from pipo_jax.rl.spec import ConfigError
from tests.scripts import run_script
from tests.typed import spec_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALGOS = ("ppo", "grpo", "gspo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "kl_cov", "clip_cov", "drpo", "bapo", "disco",
         "bnpo", "copo", "riskpo", "gdpo", "adora", "sdpo", "vpd")


def check_config_values(stdout: str) -> dict:
    """{key: value} of `--check_config`'s `key = <JSON value>  # description` lines."""
    out = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition(" = ")
        out[name] = json.JSONDecoder().raw_decode(rest)[0]
    return out


def check_config_run(*flags: str) -> tuple[dict, dict]:
    """`python -m experiments.train FLAGS --check_config`, which must succeed: ({key: value},
    {key: "<JSON value>  # description"}) of its listing."""
    out = run_script("-m", "experiments.train", *flags, "--check_config")
    assert out.returncode == 0, out.stderr
    return check_config_values(out.stdout), dict(line.split(" = ", 1) for line in out.stdout.splitlines())


def config(algo="grpo", preset="micro"):
    return importlib.import_module(f"configs.{algo}").get_config(preset)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_config_validates(algo):
    for enabled in (False, True):
        c = config(algo)
        c.pipo.enabled = enabled
        spec = spec_of(c)
        assert spec.algorithm.name == algo and spec.pipo.enabled == enabled
        assert spec.batch == c.rollout.prompts_per_batch * c.rollout.group_size


def test_algorithm_settings_follow_the_paper():
    grpo, gspo, dapo, ppo, sdpo = (spec_of(config(a)) for a in ("grpo", "gspo", "dapo", "ppo", "sdpo"))
    assert (gspo.loss.clip_low, gspo.loss.clip_high, gspo.loss.clip_ratio_c, gspo.pi_ratio) == (
        3e-4, 4e-4, 0.0, "sequence")
    assert (dapo.loss.clip_low, dapo.loss.clip_high, dapo.loss.agg_mode, dapo.dapo.dynamic_sampling) == (
        0.2, 0.28, "token-mean", True)
    assert (grpo.loss.kl_estimator, grpo.loss.kl_coef, grpo.loss.agg_mode) == ("k3", 0.001, "seq-mean-token-mean")
    assert (ppo.advantage.estimator, ppo.loss.kl_in_reward, ppo.loss.kl_estimator, ppo.rollout.group_size,
            ppo.pipo.attribution) == ("gae", True, "k1", 1, "gae")
    assert (sdpo.loss.policy, sdpo.pipo.attribution, sdpo.sdpo.topk, sdpo.sdpo.ema_rate) == (
        "sdpo_jsd", "sdpo_token", 100, 0.05)
    c = config("grpo", "qwen3_4b")
    assert (c.pipo.window, c.pipo.lam, c.pipo.lr, c.train.lr) == (8, 0.1, 1e-6, 1e-6)
    assert (c.rollout.prompts_per_batch, c.rollout.group_size, c.train.mini_batch_prompts) == (128, 8, 64)
    assert config("ppo", "qwen3_8b").rollout.prompts_per_batch == 1024


# Paper Table 5 (Qwen3-4B/8B runs): batch, mini-batch, micro-batch (per GPU), epochs, clip low/high,
# G, filter groups, KL in reward / loss; shared: KL coef 0.001, lr 1e-6, temperature 1.0,
# prompt <= 512 and response <= 4096 tokens, K = 8, alpha_PI = 1e-6, lam = 0.1.
TABLE5 = {
    "ppo": (1024, 512, 4, 24, 0.2, 0.2, 1, False, True),
    "grpo": (128, 64, 4, 3, 0.2, 0.2, 8, False, False),
    "gspo": (128, 64, 4, 3, 3e-4, 4e-4, 8, False, False),
    "dapo": (128, 64, 4, 9, 0.2, 0.28, 8, True, False),
}


@pytest.mark.parametrize("preset", ["qwen3_4b", "qwen3_8b"])
@pytest.mark.parametrize("algo", sorted(TABLE5))
def test_qwen3_presets_are_table5(algo, preset):
    c = config(algo, preset)
    got = (c.rollout.prompts_per_batch, c.train.mini_batch_prompts, c.train.micro_batch_size_per_device,
           c.task.epochs,
           c.loss.clip_low, c.loss.clip_high, c.rollout.group_size, c.dapo.dynamic_sampling, c.loss.kl_in_reward)
    assert got == TABLE5[algo]
    assert (c.loss.kl_coef, c.train.lr, c.rollout.temperature, c.task.dataset.max_prompt_tokens, c.rollout.max_new_tokens,
            c.pipo.window, c.pipo.lr, c.pipo.lam) == (0.001, 1e-6, 1.0, 512, 4096, 8, 1e-6, 0.1)
    assert c.task.name == "math" and c.model.preset == preset
    assert (c.model.param_dtype, c.model.dtype) == ("float32", "bfloat16")  # fp32 masters, bf16 compute


@pytest.mark.parametrize("algo", ALGOS)
def test_qwen3_presets_validate_with_a_model_and_data(algo, tmp_path):
    """With a (tiny stand-in) HF model directory and a MATH-style file, every algorithm's
    qwen3_4b preset is a valid run (GDPO's refused: the math task has no reward components);
    `task.epochs` sets the iteration count."""
    from pipo_jax.models import hf, qwen3
    from pipo_jax.rl.spec import run_iterations_of
    from tests.data.tiny_tokenizer import save_tiny_tokenizer

    save_tiny_tokenizer(tmp_path)
    model = qwen3.Qwen3Config(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=8192)
    (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(model)))
    (tmp_path / "math.jsonl").write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)})
                                                 + "\n" for i in range(200)))
    c = config(algo, "qwen3_4b")
    c.model.path = str(tmp_path)
    c.task.dataset.path = str(tmp_path / "math.jsonl")
    if algo == "gdpo":  # the math task's reward is one verdict per answer: no components to normalise
        with pytest.raises(ConfigError, match=r"^config\.advantage\.estimator: 'gdpo' normalises each component "
                                              r"of the reward, which the math task does not expose"):
            spec_of(c)
        return
    spec = spec_of(c)
    assert spec.model.hidden_size == 32 and spec.rollout.max_new_tokens == 4096
    assert spec.task.name == "math" and spec.task.train_size == len(spec.task.train_rows_np) == 196  # 2% of 200 held out
    row = TABLE5.get(algo, TABLE5["grpo"])  # SDPO / VPD keep the base (GRPO) run size
    epochs, batch = row[3], row[0]
    assert run_iterations_of(spec, RunConfig.from_config(c)) == max(1, round(epochs * 196 / batch))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: setattr(c, "algorithm", "reinforce"), r"config\.algorithm: 'reinforce' is not one of"),
        (lambda c: setattr(c.pipo, "window", 1), r"config\.pipo\.window: K=1 must be >= 2"),
        (lambda c: setattr(c.pipo, "lam", 1.5), r"config\.pipo\.lam: 1\.5 must be in \[0, 1\]"),
        (lambda c: setattr(c.pipo, "lam", -0.1), r"config\.pipo\.lam"),
        (lambda c: setattr(c.rollout, "group_size", 1), r"config\.rollout\.group_size: G=1 with a group method"),
        (lambda c: setattr(c.train, "mini_batch_prompts", 3), r"config\.train\.mini_batch_prompts: 3 does not divide"),
        (lambda c: setattr(c.train, "micro_batch_size_per_device", 3),
         r"config\.train\.micro_batch_size_per_device: 3 does not divide"),
        (lambda c: setattr(c.train, "micro_batch_size", 4), r"config\.train\.micro_batch_size: .*per_device"),
        (lambda c: setattr(c.model, "param_dtype", "bfloat16"), r"config\.model\.param_dtype: 'bfloat16'.*float32"),
        (lambda c: setattr(c.loss, "agg_mode", "mean"), r"config\.loss\.agg_mode: 'mean' is not one of"),
        (lambda c: setattr(c.loss, "policy", "sdpo_jsd"), r"config\.loss\.policy: 'sdpo_jsd' does not fit"),
        (lambda c: setattr(c.rollout, "top_p", 0.0), r"config\.rollout\.top_p"),
        (lambda c: setattr(c.task.arithmetic, "max_digits", 12),
         r"config\.task\.arithmetic\.max_digits: 12 must be in \[1, 8\]"),
        (lambda c: setattr(c.task.arithmetic, "min_digits", 3),
         r"config\.task\.arithmetic\.min_digits: 3 > task\.arithmetic\.max_digits=2"),
        (lambda c: setattr(c.task, "max_digits", 12),  # a key a release moved: its new place named
         r"^config\.task\.max_digits: moved: set config\.task\.arithmetic\.max_digits$"),
        (lambda c: setattr(c.model, "logprob_impl", "cuda"), r"config\.model\.logprob_impl"),
        (lambda c: setattr(c.loss, "norm_length", -1), r"config\.loss\.norm_length: -1 must be >= 0"),
        (lambda c: setattr(c.loss.bapo, "rho", 1.5),
         r"config\.loss\.bapo\.rho: 1\.5 must be <= 1: with loss\.bapo\.variant=paper it is a share of the contribution"),
        (lambda c: setattr(c.loss, "bapo_rho", 0.5),  # a method's key moved into its section: the new place named
         r"^config\.loss\.bapo_rho: moved: set config\.loss\.bapo\.rho$"),
        (lambda c: setattr(c.loss.bapo, "rho", -0.5), r"config\.loss\.bapo\.rho: -0\.5 must be >= 0"),
        (lambda c: setattr(c.loss.disco, "score", "logL"),
         r"config\.loss\.disco\.score: 'logL' is not one of \('log_likelihood', 'likelihood_ratio'\)"),
        (lambda c: setattr(c.loss.disco, "tau", 0.0), r"config\.loss\.disco\.tau: 0\.0 must be > 0"),
        (lambda c: setattr(c.advantage.copo, "blend", "hard"),
         r"config\.advantage\.copo\.blend: 'hard' is not one of \('soft_with_zero', 'soft_with_forced', 'soft'\)"),
        (lambda c: setattr(c.advantage.copo, "gamma", -1.0), r"config\.advantage\.copo\.gamma: -1\.0 must be >= 0"),
        (lambda c: setattr(c.advantage.copo, "outcome", "answer"),
         r"config\.advantage\.copo\.outcome: 'answer' is not one of \('response', 'reward'\)"),
        (lambda c: setattr(c.advantage.riskpo, "alpha", 0.0),
         r"config\.advantage\.riskpo\.alpha: 0\.0 must be in \(0, 1\)"),
        (lambda c: setattr(c.advantage.riskpo, "beta", 0.1),
         r"config\.advantage\.riskpo\.beta: 0\.1 must be > advantage\.riskpo\.alpha=0\.2"),
        (lambda c: setattr(c.advantage.riskpo, "bundle_size", 0),
         r"config\.advantage\.riskpo\.bundle_size: 0 must be >= 1"),
        (lambda c: setattr(c.advantage.riskpo, "credit", "score"),
         r"config\.advantage\.riskpo\.credit: 'score' is not one of \('uniform', 'std', 'sum_mean'\)"),
        (lambda c: setattr(c.advantage.bnpo, "decay", 1.0),
         r"config\.advantage\.bnpo\.decay: 1\.0 must be in \[0, 1\)"),
        (lambda c: setattr(c.advantage.bnpo, "reward_max", -1.0),
         r"config\.advantage\.bnpo\.reward_max: -1\.0 must be > advantage\.bnpo\.reward_min=0\.0"),
        (lambda c: setattr(c.loss.bapo, "lower_max", 0.61),
         r"config\.loss\.bapo\.lower_max: 0\.61 leaves no step of loss\.bapo\.lower_step=0\.02 above "
         r"loss\.bapo\.lower_start=0\.6 \(Algorithm 1 would never move the bounds\)"),
        (lambda c: setattr(c.loss.bapo, "upper_max", 1.1),
         r"config\.loss\.bapo\.upper_max: 1\.1 must be >= loss\.bapo\.upper_start=1\.2"),
        (lambda c: setattr(c.loss, "norm_length", 8),
         r"config\.loss\.norm_length: 8 is seq-mean-token-sum-norm's divisor, not 'seq-mean-token-mean''s"),
    ],
)
def test_invalid_settings_name_the_key(edit, message):
    c = config("grpo")
    edit(c)
    with pytest.raises(ConfigError, match=message):
        spec_of(c)


def test_real_model_presets_need_a_model_path(tmp_path):
    c = config("grpo", "qwen3_4b")
    with pytest.raises(ConfigError, match=r"config\.model\.path: model\.preset='qwen3_4b' needs the Hugging Face"):
        spec_of(c)
    c.model.path = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"config\.model\.path: .*missing' is not a directory"):
        spec_of(c)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        config("grpo", "huge")


def test_command_line_overrides():
    c, lines = check_config_run("--config=configs/dapo.py:tiny", "--config.pipo.enabled=true", "--config.pipo.lam=0.2",
                                "--config.rollout.group_size=4")
    assert (c["algorithm"], c["pipo.enabled"], c["pipo.lam"], c["rollout.group_size"]) == ("dapo", True, 0.2, 4)
    # every key the run uses with its description, from its one declaration (config/sections.py)
    assert lines["pipo.lam"] == "0.2  # lambda: the PI step's scale when the improvement signal is negative"
    assert lines["loss.policy"].endswith("[token_clip | gspo | cispo | kl_cov | clip_cov | drpo | bapo | disco | "
                                         "copo | sdpo_token | sdpo_jsd]")
    assert len(lines) == len(c) > 80
    # only the keys this run uses: no other method's settings, no critic / teacher / VPD section, no other task's
    assert not [k for k in lines if k.startswith(("loss.bapo.", "advantage.copo.", "critic.", "sdpo.", "vpd.",
                                                  "task.dataset."))]
    bad = run_script("-m", "experiments.train", "--config=configs/grpo.py:tiny", "--config.pipo.window=1",
                     "--check_config")
    assert bad.returncode != 0 and "config.pipo.window: K=1 must be >= 2" in bad.stderr
