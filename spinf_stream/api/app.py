"""The FastAPI application of the HTTP API: routes, API keys, limits and one error shape.

Errors are OpenAI's shape, ``{"error": {"type", "message", "param"}}``: 400
``invalid_request_error`` (a body that does not validate, too many messages, a prompt over the
model's context or a parameter not served, naming it in ``param``), 401
``authentication_error`` (a missing or wrong ``Authorization: Bearer`` key, compared in constant
time), 404 ``not_found_error`` (a pack, calibration or model not served), 413
``request_too_large`` (a body over ``max_body_bytes``, refused before it is read whole), 429
``rate_limit_error`` (the queue is full; ``Retry-After`` says when to try again), 504
``timeout_error`` (a request over ``timeout_s``; its messages that have not run leave the queue).
No message content is logged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

from pydantic import Discriminator, Tag

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spinf_stream.api.bodies import (
    CompletionRequest, CompletionResponse, ErrorResponse, GenerativeScoreRequest, GenerativeScoreResponse, ItemScoreRequest,
    ItemScoreResponse, ModelEntry, ModelsResponse, PackEntry, PacksResponse, ScoreRequest, ScoreResponse, Usage,
)
from spinf_stream.api.completions import complete_request
from spinf_stream.api.item_scoring import generative_scores, score_items
from spinf_stream.api.reads import ModelReads
from spinf_stream.api.scoring import ApiScoring, BadRequest, QueueFull, UnknownLane

T = TypeVar("T")


def _shape(body: Any) -> str:
    """Which shape a ``/v1/score`` body has: SGLang's (``query``/``items``) or spinf's (``pack``)."""
    keys = body.keys() if isinstance(body, dict) else vars(body) if hasattr(body, "__dict__") else ()
    return "sglang" if "query" in keys or "items" in keys else "spinf"


#: the tags of ``/v1/score``'s two shapes (left out of the names of fields in errors)
SHAPES = ("spinf", "sglang")

AnyScoreRequest = Annotated[
    Annotated[ScoreRequest, Tag("spinf")] | Annotated[ItemScoreRequest, Tag("sglang")], Discriminator(_shape)]

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
               413: "request_too_large", 422: "invalid_request_error", 429: "rate_limit_error", 499: "client_closed_request",
               504: "timeout_error"}
#: seconds between checks that a model read's client is still connected
DISCONNECT_POLL_S = 0.1
ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 429, 504)}


class ApiError(Exception):
    """An error answered in the API's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers


def error_response(status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"type": ERROR_TYPES.get(status, "server_error"), "message": message, "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


class ClientGone(Exception):
    """The request's client disconnected before its answer."""


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """``work``, cancelled (raising :class:`ClientGone`) when ``request``'s client disconnects:
    a model read's engine steps stop with it (:meth:`~spinf_stream.api.reads.ModelReads.run`)."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)

    watcher = asyncio.create_task(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the request's timeout, or the server stopping
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413, by its ``Content-Length``
    before any byte is read, or as soon as the streamed bytes pass it (a body without a length is
    read here, at most ``max_bytes`` of it, then handed to the application)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = error_response(413, f"the request body is over {self.max_bytes} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                await too_large(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server reads no more than the length
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RequestMetrics:
    """ASGI middleware: each HTTP request reported to ``telemetry``
    (:meth:`~spinf_stream.telemetry.recorder.StreamTelemetry.http_request`: in flight, duration by
    method, route template and status, a server span current while the request runs)."""

    def __init__(self, app: ASGIApp, telemetry: Any) -> None:
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.telemetry.http_request(scope["method"]) as request:

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    request.status = int(message["status"])
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                request.route = getattr(scope.get("route"), "path", None)


def models_of(scoring: ApiScoring) -> Callable[[], list[ModelEntry]]:
    """The models of ``scoring``'s lanes, each loaded or not now (a lane without a ``loaded``
    attribute holds its model for good)."""

    def models() -> list[ModelEntry]:
        out: dict[str, ModelEntry] = {}
        for lane in scoring.lanes.values():
            info = lane.scorer.model_info
            out.setdefault(lane.model, ModelEntry(id=lane.model, loaded=bool(getattr(lane.scorer, "loaded", True)),
                                                  sha256=getattr(info, "sha256", None)))
        return list(out.values())

    return models


def create_app(
    scoring: ApiScoring, *, api_keys: Sequence[str] = (), max_body_bytes: int = 8 << 20, max_messages: int = 1024,
    timeout_s: float = 60.0, models: Callable[[], list[ModelEntry]] = list, retry_after_s: int = 1,
    reads: ModelReads | None = None, max_logprobs: int = 20, telemetry: Any = None,
) -> FastAPI:
    """The API over ``scoring`` (packs) and ``reads`` (item scoring, completions; ``None``: the
    lanes' models with ``scoring``'s engine thread); ``models()``: the models served and their
    load state now; ``api_keys`` empty: no key asked; ``max_logprobs``: completions' top-N bound;
    ``telemetry``: where requests are reported (:class:`RequestMetrics`; ``None``: nowhere)."""
    if reads is None and scoring is not None:
        reads = ModelReads(list(scoring.lanes.values()), scoring.engine_thread, token_budget=scoring.token_budget,
                           max_queued=scoring.max_queued, telemetry=telemetry)
    app = FastAPI(title="spinf-stream", version="1", summary="Score messages against prompt packs with a decision model.")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if telemetry is not None:  # outermost: a 413 is counted too
        app.add_middleware(RequestMetrics, telemetry=telemetry)
    bearer = HTTPBearer(auto_error=False)
    keys = [k.encode() for k in api_keys]

    async def require_key(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if not keys:
            return
        given = (credentials.credentials if credentials is not None else "").encode()
        ok = False
        for k in keys:  # every key compared, each in constant time
            ok |= hmac.compare_digest(given, k)
        if not ok:
            raise ApiError(401, "a valid API key is required: Authorization: Bearer <key>",
                           headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(x) for x in first.get("loc", ())]
        loc = loc[2:] if loc[:1] == ["body"] and loc[1:2] and loc[1] in SHAPES else [x for x in loc if x != "body"]
        return error_response(400, f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid')}", ".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("API request failed: %s", type(exc).__name__, exc_info=exc)
        return error_response(500, f"internal error ({type(exc).__name__})")

    async def guarded(work: Awaitable[T], request: Request | None = None) -> T:
        """``work`` with the request's timeout, its failures as API errors; with ``request``,
        dropped (what has not run) as soon as its client disconnects (499, nginx's code)."""
        try:
            async with asyncio.timeout(timeout_s):
                return await (work if request is None else _unless_disconnected(request, work))
        except ClientGone:
            raise ApiError(499, "the client closed the connection; what had not run was dropped") from None
        except BadRequest as e:
            raise ApiError(400, str(e), e.param) from None
        except UnknownLane as e:
            raise ApiError(404, str(e), e.param) from None
        except QueueFull as e:
            raise ApiError(429, str(e), headers={"Retry-After": str(retry_after_s)}) from None
        except TimeoutError:
            raise ApiError(504, f"the request took over {timeout_s:g} s; what had not run was dropped") from None

    @app.post("/v1/score", response_model=ScoreResponse | ItemScoreResponse, responses=ERRORS, dependencies=[Depends(require_key)])
    async def score(body: AnyScoreRequest, request: Request) -> ScoreResponse | ItemScoreResponse:
        """Score each message against a pack (spinf's shape: ``pack``, ``messages``; one record
        per message, in order), or each item after a query (SGLang's shape: ``query``, ``items``,
        ``label_token_ids``; ``scores[item][label]``)."""
        if isinstance(body, ItemScoreRequest):
            assert reads is not None
            return await guarded(score_items(reads, body), request)
        return await score_messages(body)

    async def score_messages(body: ScoreRequest) -> ScoreResponse:
        if len(body.messages) > max_messages:
            raise ApiError(400, f"{len(body.messages)} messages; at most {max_messages} per request", "messages")
        if isinstance(body.pack, dict):
            lane = await guarded(scoring.inline_lane(body.pack, body.calibration, body.model))
        else:
            try:
                lane = scoring.lane_for(body.pack, body.calibration, body.model)
            except UnknownLane as e:
                raise ApiError(404, str(e), e.param) from None
        scored = await guarded(scoring.score(lane, body.messages))
        return ScoreResponse(records=scored.records, usage=Usage(prompt_tokens=scored.prompt_tokens,
                                                                 computed_tokens=scored.computed_tokens))

    @app.post("/v1/generative-scores", response_model=GenerativeScoreResponse, responses=ERRORS,
              dependencies=[Depends(require_key)])
    async def generative_scoring(body: GenerativeScoreRequest, request: Request) -> GenerativeScoreResponse:
        """vLLM's generative scores: each label token's probability after ``query + item``
        (softmax over the labels by default), per item."""
        assert reads is not None
        return await guarded(generative_scores(reads, body), request)

    app.add_api_route("/generative_scoring", generative_scoring, methods=["POST"], response_model=GenerativeScoreResponse,
                      responses=ERRORS, dependencies=[Depends(require_key)])

    @app.post("/v1/completions", response_model=CompletionResponse, responses=ERRORS, dependencies=[Depends(require_key)])
    async def completions(body: CompletionRequest, request: Request) -> CompletionResponse:
        """OpenAI's completions, greedy: ``echo`` with ``logprobs`` gives every prompt token's
        log-probability; ``max_tokens`` (up to 256) tokens written greedily."""
        assert reads is not None
        return await guarded(complete_request(reads, body, max_logprobs), request)

    @app.get("/v1/packs", response_model=PacksResponse, responses=ERRORS, dependencies=[Depends(require_key)])
    async def list_packs() -> PacksResponse:
        """The packs served: versions, questions, choices, default calibration."""
        seen: dict[str, PackEntry] = {}
        for lane in scoring.lanes.values():
            if lane.pack in seen or lane.key.startswith("inline|"):
                continue
            pack = lane.scorer.pack
            cal = getattr(lane.scorer, "calibration", None)
            seen[lane.pack] = PackEntry(
                name=lane.pack, version=lane.version, fields=list(pack.fields),
                questions=[{"id": q.id, "choices": list(q.choices), "kind": "extraction" if q.extract is not None else "choice"}
                           for q in pack.expand()],
                calibration=(getattr(cal, "id", None) or "loaded") if cal is not None else None)
        return PacksResponse(data=list(seen.values()))

    @app.get("/v1/models", response_model=ModelsResponse, responses=ERRORS, dependencies=[Depends(require_key)])
    async def list_models() -> ModelsResponse:
        """The models served and whether each is loaded now."""
        return ModelsResponse(data=models())

    return app


def openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document (``/openapi.json``; checked in as ``schemas/openapi.json``)."""
    from typing import cast

    return create_app(cast(ApiScoring, None)).openapi()
