"""The online loop: tail-follow training, the orchestration of collector + endpoint + agent workers, and the demo."""
