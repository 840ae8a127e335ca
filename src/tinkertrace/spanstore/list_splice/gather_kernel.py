"""Compiled (numba) kernel of ``splice``: a page's list values gathered in row order.

Sorting a file's spans used to copy every token list into sorted order (an Arrow ``take``) and then
copy each page's values again to split their bytes into streams. :func:`gather_items` does both in
one pass, one row at a time, so a row's values are split while they are in cache (~0.8 instead of
~1.6 µs per span for 300 token ids, measured in-process; the Parquet stage of
benchmarks/collector_convert.py went down by ~1 µs per span). Needs the ``collector`` extra; without
numba ``splice`` gathers with numpy.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def gather_items(
    items: np.ndarray, raw: np.ndarray, starts: np.ndarray, counts: np.ndarray, split: bool, out: np.ndarray
) -> None:
    """Write rows ``items[starts[r] : starts[r] + counts[r]]`` one after another into the bytes ``out``:
    as they are (PLAIN), or BYTE_STREAM_SPLIT when ``split`` (byte k of every item, for each k in turn).

    ``items`` are the values as unsigned integers of their width and ``raw`` the same memory as bytes.
    """
    width = raw.size // items.size if items.size else 1
    total = 0
    for r in range(len(counts)):
        total += counts[r]
    written = 0
    for r in range(len(starts)):
        first, count = starts[r], counts[r]
        if split:  # one loop per byte stream: each vectorises (shift, truncate, store)
            source = items[first : first + count]
            for b in range(width):
                stream = out[b * total + written : b * total + written + count]
                shift = 8 * b
                for j in range(count):
                    stream[j] = (source[j] >> shift) & 0xFF
        else:
            source_bytes = raw[first * width : (first + count) * width]
            target = out[written * width : (written + count) * width]
            for j in range(count * width):
                target[j] = source_bytes[j]
        written += count
