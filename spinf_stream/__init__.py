"""spinf-stream: score every message of a stream against a prompt pack, bit-stably.

Data flows one way: ``config`` → ``stream`` → ``packs`` → ``layout`` → ``models`` → ``engine``
→ ``records``. See ``docs/structures.md`` for a map of the code.
"""

__version__ = "0.1.0"
