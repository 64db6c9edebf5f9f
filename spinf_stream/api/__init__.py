"""The HTTP scoring API: ``POST /v1/score`` (spinf's shape with ``pack``; SGLang's with ``query``
and ``items``), ``POST /v1/generative-scores`` (vLLM's), ``POST /v1/completions`` (OpenAI's,
greedy, with echo and logprobs), ``GET /v1/packs``, ``GET /v1/models``.

:mod:`~spinf_stream.api.bodies` are the request and response bodies (pydantic),
:mod:`~spinf_stream.api.scoring` micro-batches pack requests onto the engine thread,
:mod:`~spinf_stream.api.reads` runs model reads without a pack there (limits, queue bound),
:mod:`~spinf_stream.api.item_scoring` and :mod:`~spinf_stream.api.completions` turn SGLang's,
vLLM's and OpenAI's shapes into those reads and back, :mod:`~spinf_stream.api.app` is the
FastAPI application (keys, limits, one error shape), and :mod:`~spinf_stream.api.serve` runs it
on uvicorn inside the caller's event loop (``spinf-stream serve``). The API knows nothing of
Kafka; the engine nothing of HTTP.
"""
