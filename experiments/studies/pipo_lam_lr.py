"""PIPO's lam against the learning rate on the tiny task: 4 x 2 points (x --seeds), GRPO+PIPO.

    python -m experiments.sweep --config=experiments/studies/pipo_lam_lr.py --seeds=0-2 --out=runs/lam_lr
"""

from configs import grpo


def get_config(preset: str = "tiny"):
    c = grpo.get_config(preset)
    c.pipo.enabled = True
    return c


def get_hyper(h):
    return h.product([h.sweep("pipo.lam", [0.05, 0.1, 0.2, 0.4]), h.sweep("train.lr", [1e-4, 3e-4])])
