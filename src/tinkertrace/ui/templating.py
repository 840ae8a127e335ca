"""The Jinja environment of the ui's pages and the filters its templates use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from tinkertrace.ui.outcomes import OUTCOMES, outcome_text

HERE = Path(__file__).parent


def template_environment() -> jinja2.Environment:
    """The pages' Jinja environment: autoescaping, strict about undefined names, and the filters the
    templates use."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is HTML-escaped unless a template says otherwise (none does)
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.filters["outcome"] = outcome_text
    env.filters["readable"] = _readable
    env.globals["outcomes"] = OUTCOMES
    env.filters["tojson_attr"] = lambda v: json.dumps(v)  # for data-* attributes (then escaped)
    return env


def _num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _readable(value: Any) -> str:
    """A settings or summary value as text: floats to 4 significant digits, None as a dash."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
