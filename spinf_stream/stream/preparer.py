"""Preparing: tokenizing decoded messages on their own thread, in chunks, ahead of the engine.

Messages are tokenized in chunks of :data:`PREPARE_CHUNK`, so that a full batch can start before a
large fetch is all tokenized (the batcher holds a partial one while the rest is tokenized). A
message is prepared once per target (pack) of its route, by that lane's scorer; each prepared
message goes to its lane's batcher, and one the lane rejects (``too_long``, ``too_slow``, ...) is
dead-lettered for that pack alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiokafka import TopicPartition

from spinf_stream.config import RunSettings
from spinf_stream.stream.codec import TEXT_FIELD
from spinf_stream.stream.inflight import Entry, Partition, Slot
from spinf_stream.stream.scheduler import Scheduler
from spinf_stream.stream.scorer import MessageFactory, Prepared, Scorer, is_error, prepare_messages
from spinf_stream.stream.writer import Writer

log = logging.getLogger("spinf_stream.stream.service")  # the service's log, whichever part writes it

#: Messages tokenized per call to ``Scorer.prepare``.
PREPARE_CHUNK = 128


class Preparer:
    """Tokenizes queued messages on one thread, with the over-long policy and time bound of
    :func:`~spinf_stream.stream.scorer.prepare_messages`.

    Args:
        scorers: each lane's scorer, by lane key.
        text_fields: with ``--input-format text`` or ``image``, the field each lane's pack reads (the raw
            text is decoded into the field ``text`` and renamed per lane); ``None`` for JSON.
        changed: called after each chunk (``pending`` dropped).
    """

    def __init__(
        self, settings: RunSettings, scorers: dict[str, Scorer], scheduler: Scheduler[Entry], writer: Writer,
        changed: Callable[[], None], text_fields: dict[str, str] | None = None,
    ) -> None:
        self._too_long = settings.too_long
        self._max_prepare_s = settings.max_prepare_s
        self._scorers = scorers
        self._text_fields = text_fields
        self._scheduler = scheduler
        self._writer = writer
        self._changed = changed
        #: records queued and not yet tokenized
        self.pending = 0
        # One thread: tokenizing is far ahead of the engine (bench/README.md, "Where the time went").
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="spinf-prepare")
        self._queue: asyncio.Queue[tuple[Slot, tuple[str, dict[str, Any]]]] = asyncio.Queue()

    def put(self, slot: Slot, message_id: str, fields: dict[str, Any]) -> None:
        """Queue ``slot``'s message for tokenization."""
        self._queue.put_nowait((slot, (message_id, fields)))
        self.pending += 1

    async def run(self, make_message: MessageFactory) -> None:
        """Tokenize queued messages until cancelled (messages of revoked partitions are dropped)."""
        loop = asyncio.get_running_loop()
        q = self._queue
        while True:
            chunk = [await q.get()]
            while len(chunk) < PREPARE_CHUNK and not q.empty():
                chunk.append(q.get_nowait())
            try:
                by_lane: dict[str, list[tuple[Slot, int, tuple[str, dict[str, Any]]]]] = {}
                for slot, (mid, fields) in chunk:
                    if slot.part.revoked:
                        continue
                    for i, target in enumerate(slot.targets):
                        own = fields
                        if self._text_fields is not None:  # the raw text or picture, in the field this pack reads
                            own = {k: v for k, v in fields.items() if k != TEXT_FIELD}
                            own[self._text_fields[target.lane]] = fields[TEXT_FIELD]
                        by_lane.setdefault(target.lane, []).append((slot, i, (mid, own)))
                touched: dict[TopicPartition, Partition] = {}
                for lane, items in by_lane.items():
                    prepared: list[Prepared] = await loop.run_in_executor(
                        self._pool, prepare_messages, self._scorers[lane], make_message,
                        [m for _, _, m in items], self._too_long, self._max_prepare_s,
                    )
                    for (slot, i, _), p in zip(items, prepared):
                        if slot.part.revoked:
                            continue
                        if p.truncated is not None:
                            slot.truncated[i] = p.truncated
                        item = p.item
                        if is_error(item):
                            kind = item.error.kind
                            if kind == "too_slow":
                                log.warning("%s[%d]@%d: %s", slot.record.topic, slot.record.partition,
                                            slot.record.offset, item.error.message)
                            policy = self._too_long if kind == "too_long" else None
                            self._writer.dead_letter(slot, kind, item.error.message, index=i,
                                                     message_id=slot.message_id, policy=policy)
                            touched[slot.part.tp] = slot.part
                        else:
                            self._scheduler.add(lane, (slot, i, item), int(item.cost_tokens))
                for part in touched.values():
                    self._writer.release(part)
            finally:
                self.pending -= len(chunk)
                self._changed()

    def close(self) -> None:
        """Stop the thread (a tokenization in progress finishes; queued calls are cancelled)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
