"""Keys a release moved or removed, declared as data.

RENAMED (old dotted key -> new one): a stored config (a run's config.json) is read with them at their
new place (`schema.moved_keys`); a config or command line that sets an old key is told the new one in
one line. RETIRED (dotted key -> what replaces it): a config that sets one gets the message.
"""

from __future__ import annotations


def _moved(old_section: str, new_section: str, keys: tuple[str, ...], prefix: str = "") -> dict[str, str]:
    """{old_section.<prefix><k>: new_section.<k>} for each of `keys`."""
    return {f"{old_section}.{prefix}{k}": f"{new_section}.{k}" for k in keys}


RETIRED: dict[str, str] = {
    "train.micro_batch_size": "the global micro-batch is gone: set train.micro_batch_size_per_device (sequences per "
                              "device)",
}

RENAMED: dict[str, str] = {
    # Each task's own keys moved from config.task into its section (config.task.<section>.<key>).
    **_moved("task", "task.arithmetic", ("min_digits", "max_digits", "ops", "answer_format", "reward_mode",
                                         "feedback_style")),
    "warmup.mistake_rate": "task.arithmetic.warmup_mistake_rate",
    "warmup.context_fraction": "task.arithmetic.warmup_context_fraction",
    **_moved("task", "task.dataset", (
        "path", "format", "tfds_split", "data_dir", "tfds_download", "limit", "prompt_field", "tokenizer_path",
        "prompt_style", "instruction", "enable_thinking", "max_prompt_tokens", "overlong", "verify_timeout_s",
        "verify_batch_budget_s", "verify_workers")),
    **_moved("task", "task.math", ("answer_field", "answer_pattern")),
    **_moved("task", "task.code", ("tests_field", "sandbox_memory_mb", "sandbox_allow_unconfined",
                                   "sandbox_allow_network")),
    **_moved("task", "task.reasoning_gym", ("dataset", "config", "size", "prompt", "max_prompt_chars",
                                            "max_answer_chars", "overlong"), prefix="rg_"),
    # Each method's own keys moved from config.loss / config.advantage into its settings section
    # (config.<loss | advantage>.<method>.<key>, declared beside the method's math in pipo_jax/losses/).
    **_moved("loss", "loss.kl_cov", ("ratio", "coef"), prefix="kl_cov_"),
    **_moved("loss", "loss.clip_cov", ("ratio", "low", "high"), prefix="clip_cov_"),
    **_moved("loss", "loss.drpo", ("tau", "beta", "delta"), prefix="drpo_"),
    "loss.drpo_lambda": "loss.drpo.lam",
    **_moved("loss", "loss.bapo", ("rho", "variant", "lower_start", "lower_max", "lower_step", "upper_start",
                                   "upper_max", "upper_step", "prob_weight"), prefix="bapo_"),
    **_moved("loss", "loss.disco", ("score", "negatives", "tau", "beta", "delta"), prefix="disco_"),
    **_moved("advantage", "advantage.bnpo", ("decay", "reward_min", "reward_max"), prefix="bnpo_"),
    **_moved("advantage", "advantage.copo", ("gamma", "rho", "blend", "outcome", "consistency_reward"),
             prefix="copo_"),
    **_moved("advantage", "advantage.riskpo", ("bundle_size", "alpha", "beta", "omega", "credit",
                                               "natural_baseline"), prefix="riskpo_"),
    **_moved("advantage", "advantage.adora", ("tds_weight", "success_threshold", "max_length"), prefix="adora_"),
}
