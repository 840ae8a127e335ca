"""Running an agent over tasks (rollouts) and evaluating it without training (pass@k)."""
