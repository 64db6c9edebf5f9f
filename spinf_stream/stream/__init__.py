"""Kafka side of spinf-stream: consume, micro-batch, produce, commit, dead-letter, embedded broker.

Data flows down this list; each module is named for what it is:

- ``fetch_guard``: records the Kafka client cannot parse become ``UndecodableRecord``s, not errors
- ``routing``: which (pack, model) lanes score a record, and its output topics (``--routes``)
- ``codec``: a consumed record → message (JSON object or UTF-8 text) or a rejection, through the
  decoder ``spinf-stream score`` uses too (``spinf_stream.messages``)
- ``scorer``: the narrow, typed interface to the engine (``prepare``/``run``) and the policies
  around it
- ``inflight``: what the member holds: per partition, its consumed records in input order
- ``preparer``: tokenization on its own thread, in chunks, ahead of the engine
- ``batcher``: micro-batches closed by token budget, latency window or message cap (a backlog
  fills them to the budget)
- ``scheduler``: a batcher per lane, and the policy that picks the lane whose batch runs next
- ``engine_thread``: the one thread that loads the engine and runs its forward passes
- ``records``, ``dlq``: the records written (score with source; dead letter cut to fit) and their
  headers
- ``writer``: each record's score or dead letter built as its model, sent in input order per
  partition, acknowledged
- ``offsets``: per-partition commit position (highest contiguous acknowledged offset + 1)
- ``committer``: commits those positions, in rounds
- ``rebalance``: revoked partitions settled (finished or dropped, committed) before they move
- ``lag``: lag and flow samples for the telemetry
- ``stats``: the service's counters
- ``service``: the coordinator that ties them together (``ScoringService``): start, poll,
  backpressure, ingest, the engine loop, stop
- ``broker``, ``topics``, ``produce``, ``consume``: embedded Tansu broker and small client tools
- ``topic_checks``: before the weights load, the broker answers and the topics exist (or are
  created)
- ``app``, ``dev``: process glue for the ``run`` and ``dev`` commands (the commands themselves are
  in ``spinf_stream.cli``)

Nothing here touches tensors: the engine is reached only through ``scorer.Scorer``. Metrics,
traces, health and the status line go through ``spinf_stream.telemetry.StreamTelemetry``.
"""
