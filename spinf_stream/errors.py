"""Errors every layer may raise for a usage mistake (exit code 2 at the command line)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A setting, file or service that cannot work as given, found before the slow part starts.

    The message is one line that names the flag (and its ``SPINF_*`` variable), the bad value and
    what to do instead; ``spinf-stream`` prints it and exits 2.
    """
