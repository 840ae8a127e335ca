"""Which optional extra a feature needs, read from the installed package's own metadata.

``pip install tinkertrace`` gives the SDK and its OTLP exporter; the rest comes by role
(``tinkertrace[parquet]``, ``[collector]``, ``[build]``, ``[serve]``, ``[train]``, ``[engine]``, ``[all]``,
declared once in pyproject.toml). :func:`require` tells a user which one to install instead of
failing later with an ``ImportError`` deep inside a command.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import sys

PACKAGE = "tinkertrace"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRAS = re.compile(r"\[([^\]]*)\]")
_MARKER_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


class MissingExtraError(ImportError):
    """A feature was used whose optional dependencies are not installed."""


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def extra_requirements() -> dict[str, tuple[str, ...]]:
    """Each extra's requirements (distribution names, or ``tinkertrace[...]`` self-references)."""
    extras: dict[str, list[str]] = {}
    for requirement in importlib.metadata.requires(PACKAGE) or ():
        spec, _, marker = requirement.partition(";")
        found = _MARKER_EXTRA.search(marker)
        if found:
            extras.setdefault(found.group(1), []).append(spec.strip())
    return {name: tuple(reqs) for name, reqs in extras.items()}


@functools.cache
def installed() -> frozenset[str]:
    """Normalized names of the distributions on ``sys.path``, read from their metadata folders' names
    (listing folders is ~100x faster than asking importlib.metadata for each distribution)."""
    names: set[str] = set()
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for name in listing:
            if name.endswith((".dist-info", ".egg-info")):
                names.add(_normalize(name.rsplit(".", 1)[0].split("-")[0]))
    return frozenset(names)


def missing(extra: str) -> list[str]:
    """The distributions of ``extra`` (its included extras too) that are not installed."""
    declared = extra_requirements()
    if extra not in declared:
        raise KeyError(f"tinkertrace has no extra {extra!r} (it has {sorted(declared)})")
    absent: list[str] = []
    seen: set[str] = set()
    pending = [extra]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in declared.get(name, ()):
            dist = _NAME.match(spec).group(0)  # type: ignore[union-attr]
            if _normalize(dist) == PACKAGE:
                inner = _EXTRAS.search(spec)
                if inner:
                    pending.extend(e.strip() for e in inner.group(1).split(","))
                continue
            if _normalize(dist) not in installed():
                absent.append(dist)
    return sorted(set(absent))


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtraError` naming ``extra`` if any of its distributions is missing;
    ``what`` says what needs it (a command, an option)."""
    absent = missing(extra)
    if absent:
        raise MissingExtraError(
            f"{what} needs the '{extra}' extra (missing: {', '.join(absent)}): "
            f"pip install 'tinkertrace[{extra}]'"
        )
