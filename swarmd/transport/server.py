"""gRPC service of a daemon: a thin SwarmServicer over the SwarmHandler protocol.

Owns swarmd.v1.Swarm's servicer, delegating every RPC to a SwarmHandler the daemon implements
(swarmd.transport.hosting starts it in a grpc.aio server beside health and reflection). Maps SwarmdError
subclasses to status codes (through swarmd.transport.status, the class name travelling in trailing metadata);
no torch math and no gossip policy here. Bounds what a caller can hold (swarmd.transport.limits), keyed by
the caller's verified peer id (its call's identity proof, swarmd.transport.auth.CallerCheck; an
unproven caller by its host) under a ceiling per caller host: payload streams at once (the one over
is refused with RESOURCE_EXHAUSTED, as every call over a budget or cap is: TARPIT_S late), requests per
second (GetStatus, GetConfig, ExchangeDeltas; an exchange the handler rejects costs its sender more),
PullState requests per second (a compact one a quarter: COMPACT_PULL_COST), Forward request units per
second; a payload admitted only up to the size its kind has under the daemon's config (payload_limit) and
within payload_timeout_s, and a proven caller's payload must be its own (signed by the id it proved); a
request that is not a valid protobuf message is INVALID_ARGUMENT. DialBack costs DIAL_BACK_COST request
units and is answered only for a caller that proved its peer id; the handler is handed the Caller (its host
as grpc saw it: the only host a dial-back may dial). Runs on the caller's asyncio loop and starts no
threads itself. Follows grpc/grpc examples/python/route_guide (asyncio servicer) and flower's fleet servicer.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import grpc

from swarmd.errors import Busy, DeadlineExceeded, NotFound, StaleRound, SwarmdError, Unauthenticated, ValidationError
from swarmd.transport.decoding import Undecodable, checked
from swarmd.transport.framing import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_CHUNK_BYTES,
    Encoded,
    PayloadLimit,
    read_payload,
    wire_messages,
)
from swarmd.transport.limits import (
    DEFAULT_FORWARD_BURST,
    DEFAULT_FORWARD_RATE,
    DEFAULT_PULL_BURST,
    DEFAULT_PULL_RATE,
    DEFAULT_REQUEST_BURST,
    DEFAULT_REQUEST_RATE,
    FORWARD_HOST_SHARES,
    REJECT_COST,
    Caller,
    CallerBudget,
    RateLimiter,
    StreamLimiter,
    budget,
    caller_host,
    forward_cost,
)
from swarmd.transport.status import one_line, status_code_for, trailing_metadata
from swarmd.v1 import swarm_pb2 as pb
from swarmd.v1 import swarm_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from swarmd.transport.auth import CallerCheck

logger = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Swarm"].full_name  # "swarmd.v1.Swarm"
MAX_MESSAGE_BYTES = 64 << 20  # per-message limit both ways: Forward carries (n, t, d) activations
PAYLOAD_TIMEOUT_S = 30.0  # a caller's whole payload must arrive within this (a stalled stream frees its slot)
ANSWER_MARGIN_S = 0.05  # an ExchangeDeltas answer leaves at least this long before its caller's deadline (answer_by)
_REQUESTS = (DEFAULT_REQUEST_RATE, DEFAULT_REQUEST_BURST)  # the default budgets per identity (CallerBudget.of)
_PULLS = (DEFAULT_PULL_RATE, DEFAULT_PULL_BURST)
_FORWARD = (DEFAULT_FORWARD_RATE, DEFAULT_FORWARD_BURST)
DRAIN_MESSAGES = 8  # a refused ExchangeDeltas stream: messages read (and dropped) before the refusal
REFUSAL_LOG_S = 10.0  # calls refused for one caller's budget: one log line per caller per this many seconds
DIAL_BACK_COST = 10.0  # request units a DialBack costs its caller (it makes this peer open a connection)
# pull units a compact PullState costs (int8 per row + zstd: about a quarter of a state's fp32 bytes), so that a
# later block's predecessor pulls (TrainConfig.predecessor_pulls a round, compact by default) fit the default
# budget down to half-second rounds. Its encoding costs more CPU than a full state's (3.7 against 2.5 ms for a
# d=64 block): at the default 2 units a second an identity can spend ~30 ms of the server's CPU a second on
# them, the order its request budget already allows (100 GetStatus a second at 0.26-0.44 ms each)
COMPACT_PULL_COST = 0.25
# a call refused for a budget or a cap is answered this late (a tarpit): with hosting.MAX_CONCURRENT_STREAMS a
# connection, a caller that keeps calling past its budget gets at most that many refusals per TARPIT_S out of
# one connection, however fast it calls, each costing this server a header check and an idle coroutine
TARPIT_S = 0.25
MAX_HELD = 256  # refusals held back at once (past it the next is answered at once)


class SwarmHandler(Protocol):
    """What the daemon implements; the servicer only moves bytes to and from it."""

    def status(self) -> pb.PeerStatus: ...

    def swarm_config(self) -> pb.SwarmConfig: ...

    async def pull_state(self, request: pb.PullStateRequest) -> Encoded: ...

    async def exchange(self, incoming: Encoded) -> Encoded:
        """Validate and stash the caller's delta; answer with our delta of the same round."""
        ...

    async def forward(self, request: pb.ForwardRequest) -> pb.ForwardReply: ...

    # optional: async dial_back(request: pb.DialBackRequest, caller: Caller) -> pb.DialBackReply (DialBack);
    # a handler without it answers DialBack with NOT_FOUND


def answer_by(remaining_s: float | None, arrival_s: float) -> float | None:
    """The local time after which an answer reaches its caller too late: the call's deadline (`remaining_s` from
    now, None: the caller set none) less ANSWER_MARGIN_S or the time its own payload took to arrive, the larger (an
    answer of about its size takes about as long back). Only an answer that would come too late is refused: a
    refused pair leaves a group of three or more on different states as surely as a late answer does."""
    if remaining_s is None:
        return None
    return time.monotonic() + remaining_s - max(ANSWER_MARGIN_S, arrival_s)


async def _maybe_await(value):
    return await value if inspect.isawaitable(value) else value


class SwarmServicer(pb_grpc.SwarmServicer):
    """swarmd.v1.Swarm: parse, delegate to the handler, stream the answer, map errors to codes.

    :param max_payload_bytes: largest delta/state payload accepted from a caller, in bytes
    :param max_chunk_bytes: chunk size sent, and the largest chunk accepted, in bytes
    :param payload_limit: the largest payload admitted for a header (the exact size under the daemon's config)
    :param streams: caps on payload streams at once (default: StreamLimiter())
    :param forward_rate: Forward request units per second per caller identity, under a host ceiling (default:
        CallerBudget.of(DEFAULT_FORWARD_RATE, DEFAULT_FORWARD_BURST); a bare RateLimiter: no host ceiling)
    :param payload_timeout_s: a caller's payload must have arrived this long after its stream opened
    :param callers: verifies the identity proof calls carry (None: every caller is keyed by its host)
    :param requests: GetStatus / GetConfig / ExchangeDeltas per second per caller identity, under a host ceiling
    :param pulls: PullState requests per second per caller identity, under a host ceiling
    """

    def __init__(
        self,
        handler: SwarmHandler,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        *,
        payload_limit: PayloadLimit | None = None,
        streams: StreamLimiter | None = None,
        forward_rate: RateLimiter | CallerBudget | None = None,
        payload_timeout_s: float = PAYLOAD_TIMEOUT_S,
        callers: CallerCheck | None = None,
        requests: RateLimiter | CallerBudget | None = None,
        pulls: RateLimiter | CallerBudget | None = None,
    ):
        self.handler = handler
        self.max_payload_bytes = max_payload_bytes
        self.max_chunk_bytes = max_chunk_bytes
        self.payload_limit = payload_limit
        self.streams = streams if streams is not None else StreamLimiter()
        self.forward_rate = budget(
            forward_rate if forward_rate is not None else CallerBudget.of(*_FORWARD, FORWARD_HOST_SHARES)
        )
        self.payload_timeout_s = payload_timeout_s
        self.callers = callers  # None: no call proves an identity (every caller is keyed by its host)
        self.requests = budget(requests if requests is not None else CallerBudget.of(*_REQUESTS))
        self.pulls = budget(pulls if pulls is not None else CallerBudget.of(*_PULLS))
        self._refusals: dict[str, tuple[int, float]] = {}  # Caller.key -> (refusals not logged yet, last logged)
        self._held = 0  # refusals now held back (TARPIT_S)

    def caller(
        self, context: grpc.aio.ServicerContext, method: str, over: Callable[[Caller], bool] | None = None
    ) -> Caller:
        """Who the call is from: its host, and the peer id its identity proof verified ("" when none holds).

        :param over: whether a caller is over its budget for this call: a call whose proof claims an identity that
            is over it is refused (Busy) before its signature is checked (it would be refused once checked; a
            false claim is refused and spends nothing of anyone's), so a flood past its budget costs no Ed25519
        """
        host = caller_host(context.peer())
        if self.callers is None:
            return Caller(host)
        metadata = context.invocation_metadata()
        claimed = Caller(host, self.callers.claimed(metadata))
        if claimed.peer_id and over is not None and over(claimed):
            raise Busy(f"{claimed} is over its budget for {method}; slow down")
        return Caller(host, self.callers.of(f"/{SERVICE_NAME}/{method}", metadata))

    def _refused(self, method: str, caller: Caller | None, exc: SwarmdError) -> None:
        """Log a call refused for its caller's budget (or a repeat): the first at once, then one line per caller
        per REFUSAL_LOG_S with how many (a flood writes no line per call)."""
        key = caller.key if caller is not None else ""
        count, logged = self._refusals.get(key, (0, float("-inf")))
        now = time.monotonic()
        if now - logged < REFUSAL_LOG_S:
            self._refusals[key] = (count + 1, logged)
            return
        self._refusals[key] = (0, now)
        while len(self._refusals) > 4096:
            self._refusals.pop(next(iter(self._refusals)))
        more = f" (and {count} more refused since the last line)" if count else ""
        logger.info("[Swarm.%s] %s: %s%s", method, status_code_for(exc).name, one_line(exc), more)

    async def _refuse(
        self, context: grpc.aio.ServicerContext, method: str, caller: Caller | None, exc: SwarmdError
    ) -> NoReturn:
        """Abort a call refused for a budget or a cap (RESOURCE_EXHAUSTED; TARPIT_S late, while fewer than MAX_HELD
        are held) or a stale round, logged as _refused does."""
        self._refused(method, caller or Caller(caller_host(context.peer())), exc)
        if isinstance(exc, Busy) and self._held < MAX_HELD:
            self._held += 1
            try:
                await asyncio.sleep(TARPIT_S)
            finally:
                self._held -= 1
        await context.abort(status_code_for(exc), one_line(exc), trailing_metadata(exc))
        raise RuntimeError("context.abort() returned")  # it always raises; this line is for type checkers

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, exc: BaseException) -> NoReturn:
        code = status_code_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            logger.exception("[Swarm.%s] handler failed", method, exc_info=exc)
        else:
            logger.info("[Swarm.%s] %s: %s", method, code.name, one_line(exc))
        await context.abort(code, one_line(exc), trailing_metadata(exc))
        raise RuntimeError("context.abort() returned")  # it always raises; this line is for type checkers

    async def _answer(self, context: grpc.aio.ServicerContext, method: str, call: Callable[[], Any]) -> Any:
        """The handler's answer to call() (awaited if it is awaitable); any exception aborts the RPC."""
        try:
            return await _maybe_await(call())
        except Exception as exc:
            await self._abort(context, method, exc)

    async def _parsed(self, context: grpc.aio.ServicerContext, method: str, request: Any) -> None:
        """Abort with INVALID_ARGUMENT when the request was not a valid protobuf message."""
        if isinstance(request, Undecodable):
            await self._abort(context, method, request.exception())

    def _admitted(
        self, context: grpc.aio.ServicerContext, method: str, limiter: CallerBudget, stream: bool, cost: float = 1.0
    ) -> Caller:
        """The caller, once it has spent `cost` requests of its budget in `limiter` and (stream) taken a stream slot;
        raises Busy (spending nothing) when it cannot."""
        over = lambda c: limiter.exhausted(c, cost) or (stream and self.streams.full(c))
        caller = self.caller(context, method, over)
        limiter.take(caller, cost)
        if stream:
            try:
                self.streams.acquire(caller)
            except Busy:
                limiter.refund(caller, cost)
                raise
        return caller

    async def _admit(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        limiter: CallerBudget,
        stream: bool = False,
        cost: float = 1.0,
    ) -> Caller:
        """_admitted, aborting with RESOURCE_EXHAUSTED when the caller is over a budget or a cap."""
        try:
            return self._admitted(context, method, limiter, stream, cost)
        except Busy as exc:
            await self._refuse(context, method, None, exc)

    async def GetStatus(self, request: pb.StatusRequest, context) -> pb.PeerStatus:
        await self._parsed(context, "GetStatus", request)
        await self._admit(context, "GetStatus", self.requests)
        return await self._answer(context, "GetStatus", self.handler.status)

    async def GetConfig(self, request: pb.ConfigRequest, context) -> pb.SwarmConfig:
        await self._parsed(context, "GetConfig", request)
        await self._admit(context, "GetConfig", self.requests)
        return await self._answer(context, "GetConfig", self.handler.swarm_config)

    async def DialBack(self, request: pb.DialBackRequest, context) -> pb.DialBackReply:
        """The handler's dial_back for a caller that proved its peer id, for DIAL_BACK_COST of its request budget."""
        await self._parsed(context, "DialBack", request)
        caller = await self._admit(context, "DialBack", self.requests, cost=DIAL_BACK_COST)
        dial_back = getattr(self.handler, "dial_back", None)
        if dial_back is None:
            await self._abort(context, "DialBack", NotFound("this peer does not answer dial-back requests"))
        if not caller.peer_id:
            error = Unauthenticated("a dial-back request must prove the asker's peer id (a signed call)")
            await self._abort(context, "DialBack", error)
        return await self._answer(context, "DialBack", partial(dial_back, request, caller))

    async def PullState(self, request: pb.PullStateRequest, context) -> AsyncIterator[pb.Payload | bytes]:
        await self._parsed(context, "PullState", request)
        cost = COMPACT_PULL_COST if request.compact else 1.0
        caller = await self._admit(context, "PullState", self.pulls, stream=True, cost=cost)
        try:
            enc = await self._answer(context, "PullState", partial(self.handler.pull_state, request))
            for msg in wire_messages(enc, self.max_chunk_bytes):
                yield msg
        finally:
            self.streams.release(caller)

    async def ExchangeDeltas(self, request_iterator, context) -> AsyncIterator[pb.Payload | bytes]:
        """Read the caller's payload, let the handler answer, stream the answer back.

        A ValidationError (bad framing or a delta the handler refuses) is answered in-band with
        Payload(reject=reason), which the caller's read_payload turns into PeerRejected.
        """
        opened = time.monotonic()
        try:
            caller = self._admitted(context, "ExchangeDeltas", self.requests, stream=True)
        except Busy as exc:
            await _drain(request_iterator)  # grpc aio answers INTERNAL to a bidi abort before the caller's writes
            await self._refuse(context, "ExchangeDeltas", None, exc)
        try:
            try:
                incoming = await asyncio.wait_for(
                    read_payload(
                        checked(request_iterator), self.max_payload_bytes, self.max_chunk_bytes, self.payload_limit
                    ),
                    self.payload_timeout_s,
                )
            except TimeoutError:
                raise DeadlineExceeded(f"the payload did not arrive within {self.payload_timeout_s:g} s") from None
            if caller.peer_id and incoming.header.peer_id != caller.peer_id:
                raise ValidationError(f"a payload of {incoming.header.peer_id[-6:] or '?'} sent by {caller}")
            incoming.answer_by = answer_by(context.time_remaining(), time.monotonic() - opened)
            reply = await self.handler.exchange(incoming)
        except ValidationError as exc:
            self.streams.release(caller)
            self.requests.charge(caller, REJECT_COST)  # a refused payload (a repeat too) costs its sender alone
            logger.info("[Swarm.ExchangeDeltas] rejected %s: %s", context.peer(), one_line(exc))
            yield pb.Payload(reject=one_line(exc))
            return
        except BaseException as exc:
            self.streams.release(caller)
            if not isinstance(exc, Exception):
                raise  # cancelled: the caller went away
            if isinstance(exc, StaleRound):  # e.g. a second delta of the same round and kind: judged once already
                self.requests.charge(caller, REJECT_COST)
                await self._refuse(context, "ExchangeDeltas", caller, exc)
            await self._abort(context, "ExchangeDeltas", exc)
            return
        try:
            for msg in wire_messages(reply, self.max_chunk_bytes):
                yield msg
        finally:
            self.streams.release(caller)

    async def Forward(self, request_iterator, context) -> AsyncIterator[pb.ForwardReply]:
        """One reply per request, in order, on one long-lived stream (a sampling session)."""
        caller = self.caller(context, "Forward")
        requests = aiter(checked(request_iterator))
        while True:
            try:
                request = await anext(requests)
                self.forward_rate.take(caller, forward_cost(request))
            except StopAsyncIteration:
                return
            except Busy as exc:
                await self._refuse(context, "Forward", caller, exc)
            except SwarmdError as exc:
                await self._abort(context, "Forward", exc)
            reply = await self._answer(context, "Forward", partial(self.handler.forward, request))
            yield reply if reply is not None else pb.ForwardReply()  # e.g. end_session: an empty reply


async def _drain(requests: AsyncIterator[Any], max_messages: int = DRAIN_MESSAGES, timeout_s: float = 1.0) -> None:
    """Read (and drop) a refused request stream: up to its end, at most max_messages, waiting at most timeout_s
    (grpc aio answers INTERNAL, not the refusal, to a bidi abort while the caller still writes; a small payload
    is read to its end, a large one only so far)."""

    async def read() -> None:
        n = 0
        async for _ in requests:
            n += 1
            if n >= max_messages:
                return

    try:
        await asyncio.wait_for(read(), timeout_s)
    except Exception:  # whatever the caller sent (or not), the call is refused next
        pass
