"""BrokerConnection: one pipelined TCP connection to a broker, responses matched by correlation id.

Callers send typed request messages (`protocol.messages`) and get typed responses back.
Requests are written as soon as they are made (up to `max_in_flight` outstanding); each gets a
future resolved by its response. Closing the connection, or losing it, fails every pending future
with NetworkError so no caller waits forever. Loop-local.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, TypeVar

import protocol
from common.errors import NetworkError, NotAPymqBrokerError, PymqError, RequestTimedOutError, error_for_code
from protocol import Message, RequestMessage, part_size

log = logging.getLogger("pymq.client")

Reply = tuple[dict[str, Any], memoryview]
R = TypeVar("R", bound=Message)
DEFAULT_MAX_RESPONSE_BYTES = 256 << 20
# A connection's first correlation id, bytes 8-11 of its first frame: "\r\n\r\n". An HTTP server
# (a metrics port, a proxy given as --bootstrap) reads a request up to a newline and then a blank
# line, so it answers this frame at once with an error, which the decoder recognizes, instead of
# waiting for more bytes while the client waits out its request timeout.
FIRST_CORRELATION_ID = 0x0D0A0D0A


def raise_for_error(control: dict[str, Any]) -> None:
    """Raise the PymqError a response's top-level `error_code` names, if any."""
    code = control.get("error_code", 0)
    if code:
        raise error_for_code(code, control.get("error_message"))


class BrokerConnection(asyncio.BufferedProtocol):
    """Responses are received in place (see protocol._FrameReader): a fetch response's record
    batches are read by the kernel into the buffer the consumer decodes them from."""

    def __init__(self, host: str, port: int, max_in_flight: int = 64,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.host, self.port = host, port
        self.decoder = protocol.ResponseDecoder(max_response_bytes)
        self._pending: dict[int, tuple[asyncio.Future[Reply], asyncio.TimerHandle | None]] = {}
        self._ids = itertools.count(FIRST_CORRELATION_ID)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._transport: asyncio.Transport | None = None
        self._closed_error: PymqError | None = None
        # Closed because a request on it went unanswered (the broker hung or was cut off), not
        # lost or refused: its callers wait for the broker to answer again before resending to it
        # (the producer's sender, the consumer's fetcher: Cluster.await_answer_or_move).
        self.timed_out = False
        self._drained = asyncio.Event()
        self._drained.set()

    @classmethod
    async def open(cls, host: str, port: int, timeout_s: float = 10.0, local_host: str | None = None,
                   **kwargs: Any) -> "BrokerConnection":
        """Connect to host:port (from `local_host`'s address when given: a broker's connections to
        other brokers leave from its own address)."""
        loop = asyncio.get_running_loop()
        local_addr = None if local_host is None else (local_host, 0)
        try:
            async with asyncio.timeout(timeout_s):  # not wait_for, which on 3.11 can swallow a cancel
                _, conn = await loop.create_connection(lambda: cls(host, port, **kwargs), host, port,
                                                       local_addr=local_addr)
        except (OSError, TimeoutError) as err:
            raise NetworkError(f"cannot connect to broker {host}:{port}: {err}") from err
        return conn

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    @property
    def outstanding(self) -> int:
        """Requests written and not answered yet."""
        return len(self._pending)

    def unanswered(self, err: BaseException) -> bool:
        """Whether `err`, which failed a request on this connection, means the broker did not
        answer in time: the request's own timeout, or the connection closed when another
        request on it timed out. Not a lost or refused connection, nor a broker's answer."""
        return self.timed_out and isinstance(err, (RequestTimedOutError, NetworkError))

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(NetworkError(f"connection to {self.host}:{self.port} lost: {exc or 'closed by broker'}"))
        self._drained.set()

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            for response in self.decoder.received(nbytes):
                entry = self._pending.pop(response.correlation_id, None)
                if entry is None:
                    log.warning("response for unknown correlation id %d from %s:%d", response.correlation_id, self.host, self.port)
                    continue
                future, timer = entry
                if timer is not None:
                    timer.cancel()
                if not future.done():
                    future.set_result((response.control, response.payload))
        except PymqError as err:
            if not self._pending:  # nobody waits to be told
                log.error("bad response frame from %s:%d: %s", self.host, self.port, err)
            # Waiting requests learn why: the peer does not speak pymq's protocol (an HTTP server
            # or proxy on that port answers with a "frame" of 1.2 GB: the bytes "HTTP").
            self._fail_all(NotAPymqBrokerError(f"{self.host}:{self.port} is not a pymq broker (its answer is not a "
                                               f"pymq response: {err})"))
            self.close()

    # -- requests --------------------------------------------------------------------------------

    async def send(self, message: RequestMessage[R], *, timeout_s: float | None = 30.0) -> R:
        """Send one request and wait for its response: the PymqError its top-level `error_code`
        names is raised, otherwise the typed response is returned (decoded and validated)."""
        async with self._slots:
            await self._drained.wait()
            control, payload = await self.request(message, timeout_s)
        return decode_reply(message, control, payload)

    async def send_only(self, message: RequestMessage[Any]) -> None:
        """Send a request the broker does not answer (produce with acks=0); returns once written."""
        async with self._slots:
            await self._drained.wait()
            self.write(message, expect_response=False)

    def request(self, message: RequestMessage[Any], timeout_s: float | None) -> asyncio.Future[Reply]:
        """Write one request now and return the future of its raw reply, failed with
        RequestTimedOutError after `timeout_s`. For callers that bound their own in-flight
        requests (the producer's sender): no await between deciding to send and the write, so
        no coroutine or task per request. Raises NetworkError at once if the connection is closed."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        correlation_id = self.write(message, expect_response=True)
        timer = None
        if timeout_s is not None:
            timer = future.get_loop().call_later(timeout_s, self._expire, correlation_id, timeout_s)
        self._pending[correlation_id] = (future, timer)
        return future

    def write(self, message: RequestMessage[Any], *, expect_response: bool) -> int:
        """Frame and write `message`; its correlation id."""
        if self.closed:
            raise self._closed_error or NetworkError(f"connection to {self.host}:{self.port} is closed")
        correlation_id = next(self._ids) & 0x7FFFFFFF
        payload = message.payload()
        header = protocol.encode_request(message.api_key, message.api_version, correlation_id, message.to_control(),
                                         sum(map(part_size, payload)))
        assert self._transport is not None
        self._transport.writelines([header, *payload])  # type: ignore[list-item]
        return correlation_id

    def _expire(self, correlation_id: int, timeout_s: float) -> None:
        """A request went unanswered: the broker is hung or cut off, so the connection goes too
        (as Kafka's client disconnects on a request timeout). Its other requests fail with a
        NetworkError at once instead of each waiting out its own timeout, and the next request
        to that broker, or to "any broker", opens a fresh connection or picks another broker."""
        entry = self._pending.pop(correlation_id, None)
        if entry is not None and not entry[0].done():
            self.timed_out = True
            entry[0].set_exception(RequestTimedOutError(f"no response from {self.host}:{self.port} within {timeout_s}s"))
            self._fail_all(NetworkError(
                f"connection to {self.host}:{self.port} closed: a request got no response within {timeout_s}s"))
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._fail_all(NetworkError(f"connection to {self.host}:{self.port} closed"))

    def _fail_all(self, err: PymqError) -> None:
        self._closed_error = self._closed_error or err  # the first reason is the one to report
        pending, self._pending = self._pending, {}
        for future, timer in pending.values():
            if timer is not None:
                timer.cancel()
            if not future.done():
                future.set_exception(err)


def decode_reply(message: RequestMessage[R], control: dict[str, Any], payload: memoryview) -> R:
    """The typed response to `message` from its raw reply; the PymqError its top-level
    `error_code` names is raised instead."""
    raise_for_error(control)
    return message.response_type.from_control(control, payload)
