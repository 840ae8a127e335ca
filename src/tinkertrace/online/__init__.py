"""The online loop: tail-follow training, collector + endpoint + agent workers orchestration, the demo."""
