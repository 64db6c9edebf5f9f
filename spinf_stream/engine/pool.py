"""Many (pack, model) lanes in one engine: models loaded on demand under a memory budget.

A *lane* scores one pack with one model (:class:`LaneEngine`, a
:class:`~spinf_stream.stream.scorer.Scorer`). Registering a lane (:meth:`EnginePool.lane`) reads
the pack, the model's config and tokenizer, and the calibration, but no weights, so ``prepare``
works at once. The model's decoder loads on the lane's first ``run``; the lanes of one model share
that one decoder, and each keeps its own :class:`~spinf_stream.engine.scoring.Engine` (its pack's
preamble KV) on it while it is loaded.

Loading a model that would take the pool over its budget first unloads the least recently used
other models (LRU); a model too large for the budget on its own is loaded alone, with a warning.
:meth:`EnginePool.evict_idle` unloads models unused for ``idle_evict_s``.

Threads: ``prepare`` (and a lane's ``loaded``) may run on any thread (``prepare`` reads no
weights); ``lane`` registers at startup or on the engine thread (the caller of ``run``), and
``ensure``, ``run``, ``evict``, ``evict_idle``, ``loaded`` and the counters belong to that thread.
Nothing here locks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spinf_stream.engine import DEFAULT_TOKEN_BUDGET
from spinf_stream.engine.results import ErrorRecord, ModelRef, NumericsRef, ScoreRecord
from spinf_stream.engine.runner import RunStats
from spinf_stream.engine.scoring import DTYPE_NAMES, Engine, load_dtype, prepare_with
from spinf_stream.engine.segment import PreparedMessage, Segmenter
from spinf_stream.engine.tokenizer import SpecialTokensInFields
from spinf_stream.messages import Message
from spinf_stream.models import QUANTIZED, Decoder, ModelSpec, load_decoder, numerics, spec_for
from spinf_stream.models.vision import ImageFormat, processor_settings
from spinf_stream.models.backend import choose
from spinf_stream.models.ops import QuantizedWeight
from spinf_stream.packs import Pack, load_pack

if TYPE_CHECKING:
    from spinf_stream.calibration import Calibration
    from spinf_stream.models.int4_checkpoints import Int4Format
    from spinf_stream.models.resolve import ResolvedModel

log = logging.getLogger(__name__)

#: Share of the device's memory (CUDA) or of the usable RAM (CPU) that the default budget allows.
BUDGET_SHARE = 0.9
#: Load times kept in :attr:`EnginePool.load_seconds` (the latest ones).
LOAD_TIMES_KEPT = 1024
#: A checkpoint's linear layers, whose weights ``fp8``/``int8`` store in one byte.
_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Where multimodal checkpoints nest the text model (as :mod:`spinf_stream.models.loader` reads them).
_NESTED = ("model.language_model.", "language_model.model.", "language_model.")


class ModelLoadFailed(RuntimeError):
    """A model's weights could not be loaded (missing or corrupt file, out of memory, ...); the
    message names the model and the cause, which is chained as ``__cause__``. ``error_kind``:
    the kind of the error records the stream writes for the messages it could not score."""

    error_kind = "model_load_failed"


@dataclass(frozen=True)
class LoadedModel:
    """A loaded model, for telemetry: ``bytes`` it is counted for against the budget (measured
    weights + KV working set), ``last_used`` (the pool's clock, seconds), ``loads`` so far."""

    name: str
    bytes: int
    last_used: float
    loads: int


@dataclass(eq=False)
class _Model:
    """A model the pool knows: what is read without its weights, and its decoder while loaded."""

    name: str
    resolved: ResolvedModel
    tokenizer: Any
    spec: ModelSpec
    int4: Int4Format | None
    images: ImageFormat | None = None
    lanes: list[LaneEngine] = field(default_factory=list)
    decoder: Decoder | None = None
    header_bytes: int | None = None  # weights' bytes estimated from the safetensors headers
    weight_bytes: int | None = None  # weights' bytes measured at the latest load
    last_used: float = 0.0
    loads: int = 0


class EnginePool:
    """The models of many lanes, loaded on demand under ``budget_bytes`` (LRU eviction).

    Args:
        device: a torch device (``cpu``, ``cuda``, ``cuda:N``); dtype: a torch dtype or its name,
            ``fp8`` or ``int8``; kernels: the back end (default for the device); threads: the
            CPU back end's workers per loaded model. As :meth:`Engine.load`; check them first with
            :func:`spinf_stream.device.choose`.
        budget_bytes: bytes the loaded models may take together (their :meth:`estimate_bytes`);
            ``None``: :func:`default_budget_bytes` of ``device``.
        idle_evict_s: seconds unused after which :meth:`evict_idle` unloads a model; ``None``: never.
        allow_unstable_bits: see :class:`Engine`.
        clock: seconds, monotonic (tests pass a stand-in); read for ``last_used`` and idleness.

    Counters (engine thread): ``loads``, ``load_failures``, ``evictions`` (every unload: to make
    room, idle or asked), ``idle_evictions``, ``load_seconds`` (the latest :data:`LOAD_TIMES_KEPT`
    loads' seconds, wall clock), ``load_seconds_total`` and ``load_windows`` (the latest loads'
    ``(start, end)`` in ``time.monotonic()`` seconds: while one runs no batch does).

    Raises:
        ValueError: an unknown dtype, a back end that cannot run on ``device``, a negative budget
            or a non-positive ``idle_evict_s``.
    """

    def __init__(
        self, *, device: str = "cpu", dtype: str | torch.dtype = "float32", kernels: str | None = None,
        threads: int | None = None, budget_bytes: int | None = None, idle_evict_s: float | None = None,
        allow_unstable_bits: bool = False, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        if idle_evict_s is not None and idle_evict_s <= 0:
            raise ValueError(f"idle_evict_s must be > 0 seconds, got {idle_evict_s}")
        self.device = device
        self.dtype = load_dtype(dtype)
        self.dtype_name = self.dtype if isinstance(self.dtype, str) else DTYPE_NAMES[self.dtype]
        # fp8/int8: linear weights quantized, everything else (and the KV) in bfloat16
        self.act_dtype: torch.dtype = torch.bfloat16 if isinstance(self.dtype, str) else self.dtype
        self.kernels = choose(device, kernels, self.dtype)
        self.threads = threads
        self.budget_bytes = default_budget_bytes(device) if budget_bytes is None else budget_bytes
        self.idle_evict_s = idle_evict_s
        self.allow_unstable_bits = allow_unstable_bits
        self.clock = clock
        self.loads = 0
        self.load_failures = 0
        self.evictions = 0
        self.idle_evictions = 0
        self.load_seconds: deque[float] = deque(maxlen=LOAD_TIMES_KEPT)
        self.load_seconds_total = 0.0
        self.load_windows: deque[tuple[float, float]] = deque(maxlen=LOAD_TIMES_KEPT)
        self._models: dict[str, _Model] = {}
        self._lru: OrderedDict[str, None] = OrderedDict()  # loaded models, least recently used first
        self._numerics: NumericsRef | None = None

    # -- lanes -----------------------------------------------------------------------------

    def lane(
        self, pack: str | Path | Pack, model: str, *, token_budget: int = DEFAULT_TOKEN_BUDGET,
        calibration: str | Path | Calibration | None = "auto",
        special_tokens_in_fields: SpecialTokensInFields | None = None,
    ) -> LaneEngine:
        """Register a lane scoring ``pack`` (path, name or :class:`Pack`) with ``model`` (a
        reference as :meth:`Engine.load` takes), loading no weights: the pack, the model's
        reference, config and tokenizer (once per model) and the calibration are read now, so
        that every error but the weights' own is raised here. Each call makes a new lane.

        ``token_budget`` (tokens per forward pass), ``calibration`` and
        ``special_tokens_in_fields``: as :meth:`Engine.load`.

        Raises:
            ValueError: a bad ``token_budget`` or ``special_tokens_in_fields``.
            spinf_stream.models.resolve.ModelNotInstalled, ModelLoadError, PackError,
            spinf_stream.calibration.CalibrationError, spinf_stream.models.UnsupportedModel;
            spinf_stream.engine.segment.LayoutError: a choice whose tokens merge with its question's.
        """
        from spinf_stream import calibration as cal
        from spinf_stream.models.resolve import resolve

        if token_budget < 1:
            raise ValueError("token_budget must be a positive number of tokens")
        pk = pack if isinstance(pack, Pack) else load_pack(pack)
        known = self._models.get(model)
        resolved = known.resolved if known is not None else resolve(model)
        chosen = cal.resolve(calibration, pk, resolved)  # before any weights: a wrong file fails fast
        m = known if known is not None else self._register(model, resolved)
        lane = LaneEngine(self, m, pk, token_budget, special_tokens_in_fields, chosen)
        m.lanes.append(lane)
        return lane

    def _register(self, key: str, resolved: ResolvedModel) -> _Model:
        from transformers import AutoConfig, AutoTokenizer

        from spinf_stream.models.int4_checkpoints import int4_format

        int4 = int4_format(resolved.path / "config.json")
        config = AutoConfig.from_pretrained(str(resolved.path))
        spec = spec_for(config)
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
        m = _Model(key, resolved, tokenizer, spec, int4, ImageFormat.from_config(config, processor_settings(resolved.path)))
        self._models[key] = m
        return m

    def _model(self, model: str) -> _Model:
        if model not in self._models:
            raise KeyError(f"model {model!r} has no lane in this pool; register one with lane()")
        return self._models[model]

    # -- loading and eviction (engine thread) ----------------------------------------------

    def ensure(self, model: str) -> None:
        """Load ``model``'s decoder unless it is loaded, and mark it used now. Call from the engine
        thread only.

        Before a load, the least recently used other models are unloaded until
        ``estimate_bytes(model)`` plus the loaded models' bytes fit ``budget_bytes``; a model that
        does not fit even alone is loaded anyway (a warning is logged). Loading takes seconds
        (CPU: about 1 s per GB read).

        Raises:
            KeyError: a model with no lane. ModelLoadFailed: its weights could not be read or
                placed (the pool stays usable: other models load and run as before).
        """
        m = self._model(model)
        if m.decoder is None:
            try:
                need = self._estimate_or_fail(m)
            except ModelLoadFailed:
                self.load_failures += 1
                raise
            for other in [self._models[n] for n in self._lru]:  # oldest first
                if need + self._loaded_bytes() <= self.budget_bytes:
                    break
                log.info("unloading model %s (least recently used) to make room for %s", other.name, m.name)
                self._unload(other)
            if need + self._loaded_bytes() > self.budget_bytes:
                log.warning(
                    "model %s needs about %.1f MiB, more than the memory budget of %.1f MiB; loading it alone",
                    m.name, need / 2**20, self.budget_bytes / 2**20,
                )
            self._load(m)
        self._touch(m)

    def evict(self, model: str) -> bool:
        """Unload ``model`` (engine thread); its lanes reload it on their next ``run``.
        Returns whether it was loaded. Raises KeyError: a model with no lane."""
        m = self._model(model)
        if m.decoder is None:
            return False
        self._unload(m)
        return True

    def evict_idle(self) -> list[str]:
        """Unload the models unused for ``idle_evict_s`` seconds or more (engine thread; the
        service calls it when it has nothing to run). Returns their names, oldest first."""
        if self.idle_evict_s is None:
            return []
        now = self.clock()
        gone = [n for n in self._lru if now - self._models[n].last_used >= self.idle_evict_s]
        for n in gone:
            log.info("unloading model %s: unused for %.0f s", n, now - self._models[n].last_used)
            self._unload(self._models[n])
            self.idle_evictions += 1
        return gone

    @property
    def loaded(self) -> list[LoadedModel]:
        """The loaded models, least recently used first (engine thread)."""
        return [
            LoadedModel(n, self.estimate_bytes(n), self._models[n].last_used, self._models[n].loads) for n in self._lru
        ]

    def _load(self, m: _Model) -> None:
        start, began = time.perf_counter(), time.monotonic()
        try:
            decoder = load_decoder(
                m.resolved.path, dtype=self.dtype, device=self.device, kernels=self.kernels, threads=self.threads,
            )
        except Exception as e:  # anything the load raises: the other models stay usable
            self.load_failures += 1
            self._release_cuda()
            raise ModelLoadFailed(
                f"model {m.name!r} could not be loaded from {m.resolved.path}: {type(e).__name__}: {e}"
            ) from e
        seconds = time.perf_counter() - start
        m.decoder = decoder
        m.weight_bytes = decoder_bytes(decoder)
        m.loads += 1
        self.loads += 1
        self.load_seconds.append(seconds)
        self.load_seconds_total += seconds
        self.load_windows.append((began, time.monotonic()))
        self._lru[m.name] = None
        log.info("loaded model %s in %.2f s: %.1f MiB of weights (estimated %.1f MiB)", m.name, seconds,
                 m.weight_bytes / 2**20, (m.header_bytes or 0) / 2**20)

    def _unload(self, m: _Model) -> None:
        decoder, m.decoder = m.decoder, None
        for lane in m.lanes:
            lane._engine = None  # its preamble KV goes with the decoder
        del self._lru[m.name]
        self.evictions += 1
        if decoder is not None:
            decoder.backend.close()  # the CPU back end's worker threads
        del decoder
        self._release_cuda()

    def _release_cuda(self) -> None:
        """Hand cached CUDA blocks back, so that memory freed by an unload is free for any use."""
        if torch.device(self.device).type == "cuda":
            torch.cuda.empty_cache()

    def _touch(self, m: _Model) -> None:
        m.last_used = self.clock()
        self._lru.move_to_end(m.name)

    def _loaded_bytes(self) -> int:
        return sum(self.estimate_bytes(n) for n in self._lru)

    # -- memory ----------------------------------------------------------------------------

    def estimate_bytes(self, model: str) -> int:
        """Bytes ``model`` takes while loaded: its weights plus the KV working set of one pass.

        Weights: before the first load, the tensors' shapes read from the safetensors headers (no
        data read) times the bytes of the load dtype (:func:`checkpoint_weight_bytes`); after a
        load, the decoder's tensors measured (:func:`decoder_bytes`). KV: layers x 2 x KV heads x
        head dim x the largest ``token_budget`` of its lanes x the activations' bytes. Not counted:
        the preamble KV of each lane and a pass's other activations.

        Raises:
            KeyError: a model with no lane. ModelLoadFailed: its safetensors headers cannot be read.
        """
        m = self._model(model)
        return self._estimate_or_fail(m)

    def _estimate_or_fail(self, m: _Model) -> int:
        if m.weight_bytes is None and m.header_bytes is None:
            try:
                m.header_bytes = checkpoint_weight_bytes(m.resolved.path, m.spec, self.dtype, m.int4)
            except Exception as e:
                raise ModelLoadFailed(
                    f"model {m.name!r}: cannot read the safetensors headers in {m.resolved.path}: "
                    f"{type(e).__name__}: {e}"
                ) from e
        weights = m.weight_bytes if m.weight_bytes is not None else m.header_bytes
        tokens = max(lane.token_budget for lane in m.lanes)
        return weights + kv_working_set_bytes(m.spec, tokens, self.act_dtype)

    def _ref_before_load(self, m: _Model) -> ModelRef:
        if self._numerics is None:
            d = numerics.describe(torch.device(self.device), self.kernels, self.act_dtype)
            self._numerics = NumericsRef(isa=d.isa, library=d.library, tiles=d.tiles, bits_probe=d.bits_probe)
        return ModelRef(
            name=m.name, sha256=m.resolved.weights_sha256, device=torch.device(self.device).type,
            dtype=self.dtype_name, kernels=self.kernels, numerics=self._numerics,
        )


class LaneEngine:
    """One pack scored with one model of an :class:`EnginePool` (a
    :class:`~spinf_stream.stream.scorer.Scorer`); made by :meth:`EnginePool.lane`.

    Attributes:
        pack: the pack. model_name: the model's name in records. token_budget: tokens per
            forward pass. last_run: what the latest ``run`` computed (:class:`RunStats`).
    """

    def __init__(
        self, pool: EnginePool, model: _Model, pack: Pack, token_budget: int,
        special_tokens_in_fields: SpecialTokensInFields | None, calibration: Calibration | None,
    ) -> None:
        self.pack = pack
        self.model_name = model.name
        self.token_budget = token_budget
        self.special_tokens_in_fields = special_tokens_in_fields
        self.calibration = calibration
        # the engine's own checks of the pack against the tokenizer run here, before any weights
        self.segmenter = Segmenter(model.tokenizer, pack, model.spec.max_positions, special_tokens_in_fields,
                                   images=model.images)
        self.last_run = RunStats()
        self._pool = pool
        self._model = model
        self._engine: Engine | None = None  # built on the loaded decoder, dropped on unload
        self._info: ModelRef | None = None  # the latest engine's model block

    @property
    def loaded(self) -> bool:
        """Whether its model is loaded now."""
        return self._model.decoder is not None

    @property
    def model_info(self) -> ModelRef:
        """The ``model`` block of its records. Before the first run: what is known without the
        weights (``numerics.bits_probe`` is ``not_run`` until the probe has run at the first load);
        after it, the engine's own (kept across unloads)."""
        if self._engine is not None:
            return self._engine.model_info
        return self._info or self._pool._ref_before_load(self._model)

    @property
    def tokenizer(self) -> Any:
        """Its model's tokenizer (read without the weights)."""
        return self._model.tokenizer

    @property
    def max_positions(self) -> int:
        """Its model's context (tokens)."""
        return int(self._model.spec.max_positions)

    def loaded_decoder(self) -> Decoder:
        """Its model's decoder, loaded if it is not (:meth:`EnginePool.ensure`), for reads without
        the pack (:mod:`spinf_stream.engine.reads`). Engine thread only. Raises :class:`ModelLoadFailed`."""
        m = self._model
        self._pool.ensure(m.name)
        self._pool._touch(m)
        assert m.decoder is not None
        return m.decoder

    def prepare(self, messages: Sequence[Message]) -> list[PreparedMessage | ErrorRecord]:
        """As :meth:`Engine.prepare` (same items, same errors); loads no weights, any thread."""
        return prepare_with(self.segmenter, messages)

    def prefix_chars_bound(self, text: str) -> int:
        """As :meth:`Engine.prefix_chars_bound`."""
        return self.segmenter.prefix_chars_bound(text)

    def run(self, prepared: Sequence[PreparedMessage]) -> list[ScoreRecord]:
        """Load the model if needed (:meth:`EnginePool.ensure`), then :meth:`Engine.run`.
        Engine thread only. The first run after a load builds the lane's engine (prefills its
        pack's preamble; the first engine on a decoder also runs the bits probe).

        Raises:
            ModelLoadFailed: the model could not be loaded.
            spinf_stream.models.numerics.UnstableBits: as :class:`Engine`.
        """
        if not prepared:
            self.last_run = RunStats()
            return []
        m = self._model
        self._pool.ensure(m.name)
        if self._engine is None:
            assert m.decoder is not None
            self._engine = Engine(
                m.decoder, m.tokenizer, self.pack, m.resolved.name, self.token_budget, self.special_tokens_in_fields,
                model_sha256=m.resolved.weights_sha256, dtype_name=self._pool.dtype_name, calibration=self.calibration,
                allow_unstable_bits=self._pool.allow_unstable_bits,
            )
            self._info = self._engine.model_info
        records = self._engine.run(prepared)
        self.last_run = self._engine.last_run
        self._pool._touch(m)
        return records


# -- memory sizes --------------------------------------------------------------------------


def checkpoint_weight_bytes(
    path: Path, spec: ModelSpec, dtype: torch.dtype | str, int4: Int4Format | None = None,
) -> int:
    """Bytes the decoder's weights will take once loaded in ``dtype``, from the shapes in the
    ``*.safetensors`` headers of ``path`` (no tensor data read; milliseconds).

    Counted: the text model's tensors as the loader keeps them (a multimodal checkpoint's other
    towers, rotary buffers and, with tied embeddings, ``lm_head`` left out), each element at the
    bytes of ``dtype``; ``fp8``/``int8``: the linear layers' weights at 1 byte plus one fp32 scale
    per output channel, the rest at 2 (bfloat16). A GPTQ/AWQ layer counts 8 weights per packed
    int32 of ``qweight`` (its zeros, scales and ``g_idx`` go at load).

    Raises:
        FileNotFoundError: no ``*.safetensors`` file. safetensors' error: a header that is not one.
    """
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    quantized = isinstance(dtype, str) and dtype in QUANTIZED
    act = torch.bfloat16 if isinstance(dtype, str) else dtype
    total = 0
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for stored in st.keys():
                name = _text_name(stored)
                if not name.startswith(("model.layers.", "model.embed_tokens.", "model.norm.", "lm_head.")):
                    continue
                if name.endswith((".qzeros", ".scales", ".g_idx", "inv_freq")):
                    continue
                if name.startswith("lm_head.") and spec.tie_embeddings:
                    continue
                shape = st.get_slice(stored).get_shape()
                elements = _numel(shape)
                rows = shape[0] if shape else 1
                if name.endswith(".qweight"):  # eight 4-bit weights per int32
                    elements *= 8
                    rows = shape[1] * (8 if int4 is not None and int4.method == "awq" else 1)
                linear = name.rsplit(".", 2)[-2] in _LINEAR and not name.endswith(".bias")
                if quantized and linear:
                    total += elements + rows * 4
                else:
                    total += elements * act.itemsize
    return total


def _text_name(name: str) -> str:
    """A stored tensor's name as the loader keys it (a multimodal checkpoint's text model under
    the plain names)."""
    for p in _NESTED:
        if name.startswith(p):
            rest = name[len(p):]
            return rest if rest.startswith("lm_head") else "model." + rest
    return name


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def kv_working_set_bytes(spec: Any, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of the keys and values of one pass of ``tokens`` tokens: layers x 2 x KV heads x head
    dim x tokens x the bytes of ``dtype`` (the activations')."""
    return int(spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * tokens * dtype.itemsize)


def engine_bytes(engine: Any) -> int:
    """What one loaded :class:`~spinf_stream.engine.scoring.Engine` takes, counted like the pool's
    models: its decoder's tensors and the KV working set of one pass of its token budget."""
    decoder = engine.decoder
    return decoder_bytes(decoder) + kv_working_set_bytes(decoder.spec, engine.token_budget, decoder.dtype)


def decoder_bytes(decoder: Decoder) -> int:
    """Bytes of a loaded decoder's tensors (embedding, every layer's weights, biases, norms and
    quantization scales, final norm, LM head), each storage once (tied embeddings count once)."""
    seen: set[tuple[str, int]] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if t is None:
            return
        if isinstance(t, QuantizedWeight):
            add(t.data)
            add(t.scale)
            return
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()

    for t in (decoder.embed, decoder.final_norm, decoder.lm_head):
        add(t)
    for layer in decoder.layers:
        for f in dataclasses.fields(layer):
            add(getattr(layer, f.name))
    return total


def default_budget_bytes(device: str) -> int:
    """The pool's default memory budget (bytes): :data:`BUDGET_SHARE` of the GPU's memory on
    CUDA (``torch.cuda.mem_get_info``'s total), of :func:`usable_memory_bytes` on the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        _, total = torch.cuda.mem_get_info(dev)
        return int(total * BUDGET_SHARE)
    return int(usable_memory_bytes() * BUDGET_SHARE)


def usable_memory_bytes(*, meminfo: str | Path = "/proc/meminfo", cgroup_root: str | Path = "/sys/fs/cgroup") -> int:
    """RAM this process may use (bytes): the machine's (``MemTotal`` of ``meminfo``; where that
    cannot be read, ``os.sysconf``), capped by its cgroup's limit (v2 ``memory.max``, v1
    ``memory/memory.limit_in_bytes``) when one is set: a container's limit, not the node's RAM."""
    total: int | None = None
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024  # kB
                break
    except (OSError, ValueError, IndexError):
        pass
    if total is None:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    root = Path(cgroup_root)
    for limit_file in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            raw = limit_file.read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            total = min(total, int(raw))  # v1 writes a huge number when unlimited: min() keeps RAM
        break
    return total
