"""The HTTP scoring API: ``POST /v1/score`` (spinf's shape), ``GET /v1/packs``, ``GET /v1/models``.

:mod:`~spinf_stream.api.bodies` are the request and response bodies (pydantic),
:mod:`~spinf_stream.api.scoring` micro-batches requests onto the engine thread,
:mod:`~spinf_stream.api.app` is the FastAPI application (keys, limits, one error shape), and
:mod:`~spinf_stream.api.serve` runs it on uvicorn inside the caller's event loop
(``spinf-stream serve``). The API knows nothing of Kafka; the engine nothing of HTTP.
"""
