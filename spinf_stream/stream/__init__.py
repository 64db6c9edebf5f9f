"""Kafka side of spinf-stream: consume, micro-batch, produce, commit, dead-letter, embedded broker.

Data flows down this list; each module is named for what it is:

- ``codec``: input bytes → message (JSON object or UTF-8 text) or a rejection, through the decoder
  ``spinf-stream score`` uses too (``spinf_stream.messages``)
- ``scorer``: the narrow interface to the engine (``prepare``/``run``) and the policies around it
- ``batcher``: micro-batches closed by token budget, latency window or message cap (a backlog
  fills them to the budget)
- ``engine_thread``: the one thread that loads the engine and runs its forward passes
- ``offsets``: per-partition commit position (highest contiguous acknowledged offset + 1)
- ``records``, ``dlq``: the records written (score with source; dead letter) and their headers
- ``service``: the loop that ties them together (``ScoringService``)
- ``broker``, ``topics``, ``produce``, ``consume``: embedded Tansu broker and small client tools
- ``preflight``: before the weights load, the broker answers and the topics exist (or are created)
- ``app``, ``dev``, ``commands``: process glue and the ``run``/``dev``/``produce``/``consume`` commands

Nothing here touches tensors: the engine is reached only through ``scorer.Scorer``. Metrics,
traces, health and the status line go through ``spinf_stream.telemetry.StreamTelemetry``.
"""
