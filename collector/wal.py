"""A segmented write-ahead log of raw OTLP request bytes.

A segment starts with :data:`MAGIC`, then records ``<u32 length><u32 crc32c><i64 received_at_ns><payload>``
(CRC-32C in hardware: ~18 GB/s against zlib's crc32 at ~3.5 GB/s, i.e. 0.15 instead of 0.75 µs per
span). A segment without the magic (format 1, written by early versions, or not a segment at all) is
not replayed: :func:`iter_records` sets it aside under a name of its own and says so. Segments are
named by their creation time in nanoseconds (``<20 digits>.wal``) so names grow across restarts. A torn
record at the end of a segment (a crash mid-append, never acknowledged) ends that segment's replay, and
so does zero padding (see :class:`WriteAheadLog`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

_HEADER = struct.Struct("<IIq")
SUFFIX = ".wal"
SET_ASIDE_SUFFIX = ".unreadable"  # appended to the name of a segment of another format
MAGIC = b"TTWAL\x00\x02\n"  # format 2: CRC-32C records
BLOCK = 4096  # O_DIRECT writes whole blocks of this size, from memory aligned to it
STAGE_BYTES = 4 * 1024 * 1024  # staged bytes beyond this are written out before the batch's sync


@dataclass(frozen=True)
class WalRecord:
    received_at_ns: int
    payload: bytes


def segment_ids(wal_dir: Path) -> list[int]:
    """Ids of the segments in ``wal_dir``, oldest first."""
    if not wal_dir.is_dir():
        return []
    return sorted(int(p.stem) for p in wal_dir.glob(f"*{SUFFIX}") if p.stem.isdigit())


def segment_path(wal_dir: Path, segment: int) -> Path:
    return wal_dir / f"{segment:020d}{SUFFIX}"


class UnknownFormat(ValueError):
    """A segment that does not start with :data:`MAGIC`: this version cannot read it."""


def read_segment(path: Path) -> tuple[list[WalRecord], str | None]:
    """All intact records of a segment, and a note if a torn/corrupt tail was dropped;
    :class:`UnknownFormat` if it is not a segment of this format."""
    data = path.read_bytes()
    records: list[WalRecord] = []
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):  # empty, or a crash while the magic was written: nothing acknowledged
            return records, f"{path.name}: torn segment header dropped" if data else None
        raise UnknownFormat(f"{path.name} has no {MAGIC!r} header (a format-1 segment of an early version?)")
    offset = len(MAGIC)
    while offset < len(data):
        if offset + _HEADER.size > len(data):
            return records, f"{path.name}: torn header at byte {offset} dropped"
        length, crc, received = _HEADER.unpack_from(data, offset)
        if length == crc == received == 0:  # the zero padding of the last block: the end
            if data.count(0, offset) == len(data) - offset:
                return records, None
            return records, f"{path.name}: torn data after the padding at byte {offset} dropped"
        start = offset + _HEADER.size
        payload = data[start : start + length]
        if len(payload) != length or google_crc32c.value(payload) != crc:
            return records, f"{path.name}: torn or corrupt record at byte {offset} dropped"
        records.append(WalRecord(received, payload))
        offset = start + length
    return records, None


def holds_records(path: Path) -> bool:
    """Whether a segment holds at least one record (read from its first bytes only)."""
    try:
        with open(path, "rb") as segment:
            head = segment.read(len(MAGIC) + _HEADER.size)
    except OSError:
        return False
    return head.startswith(MAGIC) and len(head) == len(MAGIC) + _HEADER.size and any(head[len(MAGIC) :])


def unflushed_wal_note(spans_dir: Path) -> str | None:
    """A line for readers of ``spans_dir`` (``build-trajectories``, ``spans query``) when a collector's
    WAL there (``<spans_dir>/_wal/<instance>/``) holds acknowledged spans that are not in Parquet yet;
    ``None`` when there are none."""
    segments = [p for p in sorted(Path(spans_dir).glob(f"_wal/*/*{SUFFIX}")) if holds_records(p)]
    if not segments:
        return None
    size = sum(p.stat().st_size for p in segments if p.exists()) / 1e6
    instances = sorted({p.parent.name for p in segments})
    return (
        f"note: {len(segments)} write-ahead log segment(s) of collector {', '.join(instances)} "
        f"({size:.1f} MB) hold acknowledged spans that are not in Parquet yet: a running collector writes "
        "them within about a second of its last request (under load: --roll-seconds); a stopped one on "
        "its next start. They are not in this result."
    )


def iter_records(wal_dir: Path) -> Iterator[tuple[int, list[WalRecord] | None, str | None]]:
    """``(segment, its intact records, a note)`` per segment, oldest first. A segment of another format
    is renamed aside (``<name>.unreadable``: no longer a segment) and comes with ``None`` records and a
    note saying so."""
    for segment in segment_ids(wal_dir):
        path = segment_path(wal_dir, segment)
        try:
            records, note = read_segment(path)
        except UnknownFormat as exc:
            kept = path.rename(path.with_name(path.name + SET_ASIDE_SUFFIX))
            yield (
                segment,
                None,
                f"{exc}: not replayed, kept as {kept} (replay it with the version that wrote it)",
            )
            continue
        yield segment, records, note


class WriteAheadLog:
    """Appends records to the current segment; :meth:`sync` writes a batch and makes it durable.

    Records are staged in page-aligned memory and written by :meth:`sync`. Where the file system
    allows, a segment is opened with ``O_DIRECT``: its bytes go from that memory to the disk without
    being copied into the page cache, which takes less CPU per record (benchmarks/NOTES.md) and
    leaves the other threads' caches alone. ``O_DIRECT`` writes whole
    blocks (:data:`BLOCK`), so each sync pads the last block with zeros and the next one writes that block
    again, completed; replay stops at the padding. Elsewhere (tmpfs, not Linux) the writes are plain.
    """

    def __init__(self, wal_dir: Path, *, direct: bool = True) -> None:
        self.dir = wal_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.segment = 0
        self.segment_bytes = 0
        self.segment_started = 0.0
        self.direct = direct and hasattr(os, "O_DIRECT")  # False once the file system refuses it
        self._fd = -1
        self._offset = 0  # where in the segment the staged bytes go (a block boundary when direct)
        self._stage = memoryview(mmap.mmap(-1, STAGE_BYTES + 2 * BLOCK))  # page-aligned
        self._staged = 0
        self._synced_end = 0  # where the last durable batch's records end in the segment

    @property
    def is_open(self) -> bool:
        return self._fd >= 0

    def open_segment(self) -> int:
        """Start a new segment whose id is above every existing one; returns the id."""
        newest = max(segment_ids(self.dir), default=0)
        self.segment = max(time.time_ns(), newest + 1, self.segment + 1)
        path, flags = segment_path(self.dir, self.segment), os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            self._fd = os.open(path, flags | (os.O_DIRECT if self.direct else 0), 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL or not self.direct:
                raise
            path.unlink(missing_ok=True)
            self.direct = False  # this file system refuses O_DIRECT
            self._fd = os.open(path, flags, 0o644)
        self._offset = self._staged = self._synced_end = 0
        self._add(MAGIC)  # made durable by the first batch's sync, before any acknowledgement
        self.segment_bytes = 0
        self.segment_started = time.monotonic()
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return self.segment

    def append(self, payload: bytes, received_at_ns: int) -> None:
        """Stage one record (``payload`` must not be empty); :meth:`sync` writes it."""
        if not payload:
            raise ValueError("a WAL record needs a payload")
        self._add(_HEADER.pack(len(payload), google_crc32c.value(payload), received_at_ns))
        self._add(payload)
        self.segment_bytes += _HEADER.size + len(payload)

    def sync(self) -> None:
        """Write everything staged and make it durable."""
        self._write(final=True)
        os.fdatasync(self._fd)
        self._synced_end = self._offset + self._staged  # direct: the partial last block is still staged

    def close_segment(self) -> int:
        """Write what is staged, fsync and close the current segment; returns its id."""
        if self._fd >= 0:
            self._write(final=True)
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
        return self.segment

    def abandon_segment(self) -> int:
        """After a failed write or sync: drop the staged bytes, cut the segment back to the end of its last
        durable batch (best effort: the records after it were refused, not acknowledged) and close it.
        Returns its id; the acknowledged records in it stay replayable."""
        self._staged = 0
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._synced_end)
                os.fsync(self._fd)
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        return self.segment

    def delete(self, segment: int) -> None:
        segment_path(self.dir, segment).unlink(missing_ok=True)

    def _add(self, data: bytes) -> None:
        """Copy ``data`` into the staging memory, writing out whole blocks whenever it is full."""
        view = memoryview(data)
        while view:
            taken = min(STAGE_BYTES + BLOCK - self._staged, len(view))
            self._stage[self._staged : self._staged + taken] = view[:taken]
            self._staged += taken
            view = view[taken:]
            if self._staged >= STAGE_BYTES:
                self._write(final=False)

    def _write(self, *, final: bool) -> None:
        """Write the staged bytes at ``_offset``. Direct: the whole blocks, and if ``final`` the last
        partial block padded with zeros, which stays staged to be written again, completed, later."""
        staged = self._staged
        if not self.direct:
            self._pwrite(staged)
            self._offset, self._staged = self._offset + staged, 0
            return
        whole = staged // BLOCK * BLOCK
        end = -(-staged // BLOCK) * BLOCK if final else whole
        self._stage[staged:end] = bytes(end - staged)
        self._pwrite(end)
        self._stage[: staged - whole] = self._stage[whole:staged]  # the partial block moves to the front
        self._offset, self._staged = self._offset + whole, staged - whole

    def _pwrite(self, size: int) -> None:
        done = 0
        while done < size:
            try:
                done += os.pwrite(self._fd, self._stage[done:size], self._offset + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                # the file system took O_DIRECT at open but refuses its writes: write plainly
                fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                self.direct = False
