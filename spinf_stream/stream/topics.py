"""Create topics (``spinf-stream dev``, tests); production clusters create theirs ahead of time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code


async def ensure_topics(client_kwargs: dict[str, Any], names: Iterable[str], partitions: int = 3) -> None:
    """Create each topic in ``names`` that does not exist yet (``partitions`` each, replication 1)."""
    wanted = list(dict.fromkeys(names))
    kwargs = {k: v for k, v in client_kwargs.items() if k != "client_id"}
    admin = AIOKafkaAdminClient(**kwargs)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in wanted if n not in existing]
        if new:
            resp = await admin.create_topics(new)
            for topic, code, *rest in resp.topic_errors:
                if code and for_code(code) is not TopicAlreadyExistsError:
                    raise for_code(code)(f"creating topic {topic}: {rest[0] if rest else ''}")
        # Wait until the metadata shows every topic with its partitions.
        for _ in range(100):
            if set(wanted) <= set(await admin.list_topics()):
                return
            await asyncio.sleep(0.05)
    finally:
        await admin.close()
