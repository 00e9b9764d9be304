"""PPO: GAE (gamma = lam = 1) with a learned critic, k1 KL penalty in the reward, G = 1."""

from configs import base


def get_config(preset: str = "tiny"):
    c = base.algorithm_config("ppo", preset)
    c.loss.clip_low, c.loss.clip_high, c.loss.clip_ratio_c = 0.2, 0.2, 3.0
    c.loss.agg_mode = "seq-mean-token-mean"
    c.loss.kl_in_reward = True
    c.loss.kl_estimator = "k1"
    # PPO samples one response per prompt; the paper's batch is 1024 prompts.
    c.rollout.group_size = 1
    if preset in ("tiny",):
        c.rollout.prompts_per_batch = 128
        c.train.mini_batch_prompts = 64
    elif preset == "micro":
        c.rollout.prompts_per_batch = 16
        c.train.mini_batch_prompts = 8
    else:  # paper Table 5: batch 1024, mini-batch 512, 24 passes over the training prompts (task.epochs:
        # 3 passes x the G = 8 responses the group methods draw per prompt; not train.epochs)
        c.rollout.prompts_per_batch = 1024
        c.train.mini_batch_prompts = 512
        c.task.epochs = 24.0
    return c
