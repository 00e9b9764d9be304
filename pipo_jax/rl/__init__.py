"""The learner: the config schema and spec, the registered algorithms, the rollout, the PIPO
controller and the pure step functions of one iteration (`learn`), carried through a jitted
outer loop (`loop`). The job around it (trainer, checkpoints, warm-up, ...) is `pipo_jax/run/`."""
