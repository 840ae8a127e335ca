"""The online loop: tail-follow training, orchestration of collector + endpoint + agents, the demo."""
