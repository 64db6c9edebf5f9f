"""The decision engine: read a message once, answer every question of a pack from one packed pass.

It knows nothing of Kafka or HTTP. Data flows down this list:

- ``seams``, ``tokenizer``: where a prompt may be cut; prompts rendered and tokenized with seams
- ``segment``: a message and a pack → a :class:`~spinf_stream.engine.segment.PreparedMessage`
  (shared prefix and one short branch per question)
- ``layout``: prepared messages → fixed-shape passes within the token budget
- ``runner``: passes → choice log-probabilities, through a :class:`~spinf_stream.models.Decoder`
- ``results``: the records the engine returns (score, error) and their digest
- ``scoring``: :class:`Engine` (``load``, ``prepare``, ``run``, ``run_iter``, ``model_info``)
- ``pool``: :class:`~spinf_stream.engine.pool.EnginePool`: (pack, model) lanes whose models load on
  demand and are evicted, least recently used first, under a memory budget

``Engine`` and ``Message`` are imported on first use, so importing this package does not import
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

DEFAULT_TOKEN_BUDGET = 16_384
"""Tokens of one forward pass (prefix and branch rows of every message packed into it)."""

if TYPE_CHECKING:
    from spinf_stream.engine.scoring import Engine, Message

__all__ = ["DEFAULT_TOKEN_BUDGET", "Engine", "Message"]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "Message"):
        from spinf_stream.engine import scoring

        return getattr(scoring, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
