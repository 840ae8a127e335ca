"""The tinkertrace examples (a package so the agents can share :mod:`examples.common`)."""
