"""RL training: TrainState, pure step functions, outer loops, checkpoints."""
