"""The model cache on disk.

Where it lives, what names its entries, and how an entry is built
once and published whole.

Layout, under :func:`cache_dir` (or the ``cache`` argument of
:func:`spinf_stream.models.resolve.resolve`)::

    gguf/<name>-<key>/<file>.gguf   GGUF files joined from the chunks that packages ship
    models/<stem>-<key>/            converted Hugging Face directories
    locks/<name>.lock               one writer per entry at a time (flock; released if it dies)

``<key>`` is :func:`source_key` of the source files, so a reinstalled or edited source gets a
fresh entry. Every entry is built in a hidden ``.<name>.*.partial`` sibling and renamed into
place (:func:`publish`), so an entry that exists under its final name is complete; a partial left
by a killed writer is never read and is removed by the next writer of that entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import platformdirs

try:  # POSIX only; without it concurrent writers may both convert, but the rename stays safe.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# Bump when the conversion's output changes, so old cache entries are not reused.
_CACHE_FORMAT = "1"


def cache_dir() -> Path:
    """The cache root: ``$SPINF_CACHE_DIR`` if set, else the user cache dir of ``spinf-stream``.

    Not created here; :func:`spinf_stream.models.resolve.resolve` creates what it writes.
    """
    env = os.environ.get("SPINF_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("spinf-stream"))


def source_key(paths: Sequence[Path]) -> str:
    """A short hash of the files' sizes and sampled content (first and last MiB and 16 blocks of
    64 KiB spread over the file): the same weights installed in another venv or clone hit the
    same cache entry, while two fine-tunes of one architecture (same header and size) differ in
    their tensor data. Reads about 3 MiB per file.
    """
    h = hashlib.sha256(_CACHE_FORMAT.encode())
    for p in paths:
        size = p.stat().st_size
        h.update(f"\0{size}\0".encode())
        with open(p, "rb") as f:
            offsets = [0, max(0, size - (1 << 20))] + [size * i // 17 for i in range(1, 17)]
            for i, off in enumerate(offsets):
                f.seek(off)
                h.update(f.read(1 << 20 if i < 2 else 1 << 16))
    return h.hexdigest()[:12]


@contextlib.contextmanager
def _entry_lock(root: Path, name: str) -> Iterator[None]:
    """Hold an exclusive lock on cache entry ``name``; the kernel drops it if this process dies."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    lock_dir = root / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{name}.lock", "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process building cache entry %s", name)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _seal(path: Path) -> None:
    """Make the tree under ``path`` durable and readable before it is published.

    fsync: so a crash after the rename cannot expose truncated files. Read bits: mkdtemp (and
    some writers) create owner-only entries, and a model cache is shared, not secret.
    """
    os.chmod(path, 0o755)
    for p in sorted(path.rglob("*")):
        if p.is_file():
            os.chmod(p, p.stat().st_mode | 0o444)
            with p.open("rb") as f:
                os.fsync(f.fileno())


def publish(final: Path, build: Callable[[Path], None]) -> Path:
    """Create directory ``final`` atomically: ``build`` fills a hidden sibling that is then renamed.

    Returns ``final``. If another writer already published it, returns that one unchanged.
    If ``build`` raises, its partial directory is removed and the exception propagates.
    """
    if final.is_dir():
        return final
    parent = final.parent
    parent.mkdir(parents=True, exist_ok=True)
    with _entry_lock(parent.parent, f"{parent.name}-{final.name}"):
        if final.is_dir():  # built by the writer we waited for
            return final
        # Whoever holds the lock is this entry's only writer, so any partial is a dead one's.
        prefix, suffix = f".{final.name}.", ".partial"
        for stale in parent.iterdir():
            middle = stale.name[len(prefix) : -len(suffix)]
            # mkdtemp's random middle has no dot, so this never matches another entry's partial.
            if not (stale.name.startswith(prefix) and stale.name.endswith(suffix) and "." not in middle):
                continue
            logger.info("removing %s, left by an interrupted build", stale)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
        try:
            build(tmp)
            _seal(tmp)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    with contextlib.suppress(OSError):  # make the rename itself durable; best effort
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return final
