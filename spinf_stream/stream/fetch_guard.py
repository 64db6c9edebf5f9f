"""Records the Kafka client cannot parse never stop a partition.

aiokafka parses each fetched batch while ``getmany`` hands out its records. A header key that is
not UTF-8 (librdkafka producers accept any bytes there), a batch whose CRC fails, or an unknown
compression codec make that parse raise; the consumer then fails, and the same fetch comes back
after every restart. :func:`install` wraps the one place this happens
(``aiokafka.consumer.fetcher.PartitionRecords._unpack_records``): when a batch cannot be parsed,
the records of it that can be read are parsed here leniently (Kafka's record format v2), and each
record that cannot is handed out as an :class:`UndecodableRecord` at its offset, so that the
service dead-letters it (``undecodable_record``) and the position moves past the batch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiokafka.codec as codecs
from aiokafka.consumer import fetcher as _fetcher
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.util import calc_crc32c, decode_varint
from aiokafka.structs import ConsumerRecord

__all__ = ["UndecodableRecord", "install"]

#: What a parse of fetched bytes may raise on bad bytes (not on a closed or broken connection).
PARSE_ERRORS = (UnicodeError, CorruptRecordException, UnsupportedCodecError, ValueError, IndexError, struct.error)

# Record batch v2 header (KIP-98): baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordCount.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_DECOMPRESS = {1: codecs.gzip_decode, 2: codecs.snappy_decode, 3: codecs.lz4_decode, 4: codecs.zstd_decode}
_TIMESTAMP_LOG_APPEND = 0x08
_CONTROL = 0x20


@dataclass(eq=False)
class UndecodableRecord:
    """A record (or a whole batch's worth of offsets) the Kafka client could not parse: what
    could be read of it, and why. Has a ``ConsumerRecord``'s attributes; ``headers`` keep
    their keys as bytes."""

    topic: str
    partition: int
    offset: int
    reason: str
    timestamp: int = -1
    timestamp_type: int = 0
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[bytes, bytes | None], ...] = field(default_factory=tuple)
    checksum: None = None
    serialized_key_size: int = -1
    serialized_value_size: int = -1


class _TrackedMemoryRecords:
    """aiokafka's ``MemoryRecords`` that remembers the bytes of the batch it handed out last."""

    def __init__(self, data: bytes) -> None:
        self._inner = _MEMORY_RECORDS(data)
        self._data = data
        self._pos = 0
        self.current: bytes = b""

    def size_in_bytes(self) -> int:
        return self._inner.size_in_bytes()

    def has_next(self) -> bool:
        return self._inner.has_next()

    def next_batch(self) -> Any:
        if len(self._data) - self._pos >= 12:
            length = struct.unpack_from(">i", self._data, self._pos + 8)[0]
            end = self._pos + 12 + max(0, length)
            self.current = bytes(self._data[self._pos : end])
            self._pos = end
        return self._inner.next_batch()


def _salvage(parts: Any, batch: bytes, exc: BaseException) -> Iterator[Any]:
    """The records of ``batch`` from ``parts.next_fetch_offset`` on: parsed leniently where they
    can be, :class:`UndecodableRecord` where not. Leaves ``next_fetch_offset`` past the batch."""
    tp = parts._tp
    reason = f"{type(exc).__name__}: {exc}"[:500]
    first = parts.next_fetch_offset
    if len(batch) < _HEADER.size or batch[16] < 2:
        # too short to read its offsets, or the legacy format: one dead letter at the position
        yield UndecodableRecord(tp.topic, tp.partition, first, reason)
        parts.next_fetch_offset = first + 1
        return
    base, _, _, _, crc, attrs, last_delta, base_ts, max_ts, _, _, _, count = _HEADER.unpack_from(batch, 0)
    last = base + last_delta if 0 <= last_delta < 1 << 24 else base
    first = max(first, base)
    parts.next_fetch_offset = max(parts.next_fetch_offset, last + 1)
    if attrs & _CONTROL:
        return
    read: list[Any] = []
    try:
        if calc_crc32c(batch[21:]) != crc:  # corrupt bytes: no record of the batch is trusted
            raise CorruptRecordException("the batch's CRC does not match its bytes")
        codec = attrs & 0x07
        body = batch[_HEADER.size :]
        if codec:
            if codec not in _DECOMPRESS:
                raise UnsupportedCodecError(f"unknown compression codec {codec:#04x}")
            body = _DECOMPRESS[codec](body)
        pos = 0
        for _ in range(count):
            rec, pos = _read_record(tp, body, pos, base, base_ts, max_ts, attrs, reason)
            if rec.offset >= first:
                read.append(rec)
    except PARSE_ERRORS as inner:
        reason = f"{reason}; and then {type(inner).__name__}: {inner}"[:500]
    seen = {r.offset for r in read}
    missing = [UndecodableRecord(tp.topic, tp.partition, o, reason) for o in range(first, last + 1) if o not in seen]
    yield from sorted(read + missing, key=lambda r: r.offset)


def _read_record(
    tp: Any, buf: bytes, pos: int, base: int, base_ts: int, max_ts: int, attrs: int, reason: str
) -> tuple[Any, int]:
    """One record of a v2 batch at ``pos``: a ``ConsumerRecord``, or an :class:`UndecodableRecord`
    when a header key is not UTF-8. Raises ``IndexError``/``ValueError`` on bytes that are no record."""
    length, pos = decode_varint(buf, pos)
    end = pos + length
    if length < 0 or end > len(buf):
        raise ValueError(f"a record of {length} bytes runs past the batch")
    pos += 1  # attributes
    ts_delta, pos = decode_varint(buf, pos)
    off_delta, pos = decode_varint(buf, pos)

    def chunk(p: int) -> tuple[bytes | None, int]:
        n, p = decode_varint(buf, p)
        if n < 0:
            return None, p
        if p + n > end:
            raise ValueError("a field runs past its record")
        return bytes(buf[p : p + n]), p + n

    key, pos = chunk(pos)
    value, pos = chunk(pos)
    n_headers, pos = decode_varint(buf, pos)
    headers: list[tuple[bytes, bytes | None]] = []
    for _ in range(max(0, n_headers)):
        hk, pos = chunk(pos)
        hv, pos = chunk(pos)
        headers.append((hk or b"", hv))
    offset = base + off_delta
    ts_type = 1 if attrs & _TIMESTAMP_LOG_APPEND else 0
    ts = max_ts if ts_type else base_ts + ts_delta
    bad = []
    for i, (hk, _) in enumerate(headers):
        try:
            hk.decode("utf-8")
        except UnicodeDecodeError as e:
            bad.append(f"header {i} key is not UTF-8 ({e.reason} at byte {e.start})")
    if bad:
        why = "; ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")
        rec: Any = UndecodableRecord(
            tp.topic, tp.partition, offset, why, ts, ts_type, key, value, tuple(headers),
            serialized_key_size=-1 if key is None else len(key), serialized_value_size=-1 if value is None else len(value),
        )
    else:
        rec = ConsumerRecord(
            tp.topic, tp.partition, offset, ts, ts_type, key, value, None,
            -1 if key is None else len(key), -1 if value is None else len(value),
            tuple((hk.decode("utf-8"), hv) for hk, hv in headers),
        )
    return rec, end


_MEMORY_RECORDS: Any = None
_ORIGINAL_UNPACK: Any = None


def _guarded_unpack(self: Any) -> Iterator[Any]:
    while True:
        try:
            yield from _ORIGINAL_UNPACK(self)
            return
        except PARSE_ERRORS as exc:
            batch = getattr(self._records, "current", b"")
            yield from _salvage(self, batch, exc)


def install() -> None:
    """Wrap aiokafka's parse of fetched batches (once per process; idempotent)."""
    global _MEMORY_RECORDS, _ORIGINAL_UNPACK
    if _ORIGINAL_UNPACK is not None:
        return
    _MEMORY_RECORDS = _fetcher.MemoryRecords
    _ORIGINAL_UNPACK = _fetcher.PartitionRecords._unpack_records
    _fetcher.MemoryRecords = _TrackedMemoryRecords
    _fetcher.PartitionRecords._unpack_records = _guarded_unpack
