"""Loss math: advantages, policy losses, self-distillation, the PIPO controller."""
