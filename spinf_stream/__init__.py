"""spinf-stream: score every message of a stream against a prompt pack, bit-stably.

Packages, each one layer: ``engine`` (packs read once per message, packed passes, choice
logprobs; no Kafka, no HTTP) over ``models`` (the decoder and its kernels), ``stream`` (Kafka;
no tensors), ``telemetry`` (metrics, traces, health, logs), and ``cli`` (the commands). See
``docs/structures.md`` for a map of the code.
"""

__version__ = "0.1.0"
