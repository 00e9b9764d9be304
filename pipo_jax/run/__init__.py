"""The job around the learner: the trainer's loop over iterations, where its programs run
(one device or a mesh), the warm-up, evaluation, checkpoints, the workdir's guards, logs,
preemption and export. The learner itself (`pipo_jax/rl/`) knows none of this."""
