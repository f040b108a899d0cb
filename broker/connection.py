"""Connection: one client connection of the broker, from accept to close (the asyncio edge;
the broker owns the listener, docs/architecture.md, Layers). It turns bytes into `Request`s with the
protocol's `FrameDecoder` (received in place, see `_FrameReader`), hands them to `RequestHandlers`,
and writes responses.

- Requests are dispatched in arrival order. Synchronous handlers (produce, metadata, list
  offsets) run inline, so pipelined produces append in order; coroutine handlers (fetch long
  poll, admin) run as tasks. Responses carry correlation ids and may complete out of order.
- Responses never interleave: while a response with segment ranges is being sent with
  sendfile, later responses queue behind it.

Every resource a client can take is bounded (a client may be hostile), and the connection is
muted (stops reading, Kafka's channel muting) rather than taking more:

- At most `queued.max.requests` requests are in flight, counting from when a request is read
  until its response is written (answered and queued still counts); past that, and whenever
  the socket's write buffer is full, the connection stops reading. It stops in the middle of a
  receive buffer too: the frames after the one that filled the limit wait in the decoder.
- Memory is bounded in bytes (broker/backpressure.py): while the requests read and not yet
  answered hold `queued.max.request.bytes`, no connection reads; a large frame's body is read
  only once its whole size is reserved from that budget (partly received frames count), and
  while it has no room only that connection waits; while the log writer's queue is full, the
  connections with produces in flight stop reading and every other one is served. The event
  loop itself never waits for the disk.
- Queued responses hold segment descriptors (one per range): while the responses queued on all
  connections hold `queued.max.response.descriptors`, the connections with responses queued
  stop reading, so a client that never reads its socket holds a bounded number, and gives them
  back when it goes.
- A request must arrive whole within `request.read.timeout.ms` from its first byte (a client
  trickling bytes is closed; time the broker itself stops reading does not count); connections
  idle between requests for `connections.max.idle.ms` are closed.
- Accepting is bounded by `max.connections` and `max.connections.per.ip` (broker/connection_quotas.py).
- An idle connection holds no receive buffer (the decoder borrows one from the broker's pool
  while it holds unparsed bytes).

Zero copy (`zero.copy`, on both event loops): uvloop has no `loop.sendfile`, so the connection
sends a response with segment ranges itself, with os.sendfile on a dup of the transport's socket,
once the transport's write buffer is empty (nothing it queued can be overtaken) and while no other
response may be written (the queue). When the socket is full it waits for it with `add_writer` on
the dup and counts as write-paused, so reading stops as it does when the transport's buffer fills.
A segment file deleted meanwhile stays readable (the range owns a descriptor); one truncated under
the send ends it short, which aborts the connection: the frame header already promised the size.
With `zero.copy` off, ranges are read with os.pread and written through the transport.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections import deque
from collections.abc import Awaitable, Iterator
from functools import partial
from typing import Any, NamedTuple, Protocol

import protocol
from broker.backpressure import ByteBudget
from broker.cluster.broker_identity import Session
from broker.config import BrokerConfig
from broker.connection_quotas import ConnectionQuotas, normalize_address
from broker.handlers import Part, RequestHandlers, Result, error_fields, error_result, to_result
from broker.log import FetchSlice
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperation
from broker.request_metrics import RequestMetrics, RequestTimer
from common.errors import InvalidRequestError, KafkaStorageError, MessageTooLargeError, PymqError
from protocol import ApiKey

log = logging.getLogger("pymq.connection")
MSG_MORE = getattr(socket, "MSG_MORE", 0)  # Linux: a header and the range after it share packets


class ConnectionOwner(Protocol):
    """What a connection shares with the others of its broker (broker/server.py `Broker`)."""

    config: BrokerConfig
    connections: set["Connection"]
    connection_quotas: ConnectionQuotas
    handlers: RequestHandlers
    request_memory: ByteBudget
    response_descriptors: ByteBudget
    receive_buffers: protocol.ScratchPool
    request_metrics: RequestMetrics
    writer: LogWriter
    zero_copy: bool


class QueuedResponse(NamedTuple):
    """A response waiting to be written: its header and parts, the segment descriptors its ranges
    own, and the request's timer and control (metrics)."""

    header: bytes
    parts: list[Part]
    descriptors: int
    timer: RequestTimer | None
    control: dict[str, Any]


class Connection(asyncio.BufferedProtocol):
    """One client connection. Loop-local. A BufferedProtocol, so that the bytes of a large produce
    request are received straight into the buffer they are appended from."""

    def __init__(self, broker: ConnectionOwner) -> None:
        self.broker = broker
        self.loop = asyncio.get_running_loop()
        self.decoder = protocol.FrameDecoder(broker.config["socket.request.max.bytes"], pool=broker.receive_buffers,
                                             budget=broker.request_memory,
                                             max_elements=broker.config["request.max.elements"])
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.address = "?"  # the client's IP address (what max.connections.per.ip counts)
        self.last_active = self.loop.time()
        self._frame_started: float | None = None  # when the frame being received started (None: between frames)
        self.in_flight: set[asyncio.Task[None]] = set()
        self._parked: dict[DelayedOperation, protocol.Request] = {}  # this connection's fetches in the purgatory
        self._queue: deque[QueuedResponse] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._read_paused = False
        self._held_scheduled = False  # a _deliver_held is on its way (reading resumes after it)
        self._delivering_held = False
        self._stopped_reading = False
        self._produces = 0  # produce requests in flight (waiting for the log writer or their acks)
        self.session = Session()  # who the peer is: anonymous until an inter-broker handshake

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peername = transport.get_extra_info("peername")
        self.peer = str(peername)
        self.address = _address_of(peername)
        refused = self.broker.connection_quotas.try_open(self.address)
        if refused is not None:
            log.info("refusing %s: %s", self.peer, refused)  # info, as Kafka: a flood must not flood the log
            transport.abort()  # nothing was read or written: a reset, not a graceful close
            return
        self.broker.connections.add(self)
        self._update_reading()  # a connection opened while the request budget is spent waits

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.broker.connections:  # admitted (a refused one was never counted)
            self.broker.connections.discard(self)
            self.broker.connection_quotas.closed(self.address)
        self.decoder.close()  # the receive buffer back to the pool, a frame's reservation to the budget
        # Parked fetches have nobody to answer; admin changes run to completion so that
        # metadata and logs never disagree because a client hung up mid-request.
        for op, frame in self._parked.items():
            op.cancel()
            self._unhold(frame)
        self._parked.clear()
        while self._queue:
            self._dequeued(self._queue.popleft())
        if self._writer is not None:
            self._writer.cancel()

    def pause_writing(self) -> None:
        self._write_paused = True
        self._writable.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._writable.set()
        self._update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = self.loop.time()
        self._deliver(self.decoder.received(nbytes))

    # -- requests --------------------------------------------------------------------------------

    def _deliver(self, frames: Iterator[protocol.Frame]) -> None:
        """Dispatch the frames received, stopping as soon as the connection must stop reading:
        the rest stay in the decoder until it may read again (`_update_reading`)."""
        received = self.loop.time()
        delivered = False
        try:
            for frame in frames:
                delivered = True
                self._dispatch(frame, received)
                if self._must_pause():
                    break
        except InvalidRequestError as err:
            log.warning("closing %s: unrecoverable framing error: %s", self.peer, err)
            assert self.transport is not None
            self.transport.close()
            return
        if not self.decoder.buffered_bytes:
            self._frame_started = None
        elif delivered or self._frame_started is None:
            self._frame_started = received  # the next frame started in this receive, or now
        self._update_reading()

    def _deliver_held(self) -> None:
        """The connection may read again: deliver the frames the decoder held while it was muted
        and read the large frame that waited for the budget, then resume the socket (the
        `_update_reading` at the end of `_deliver`), unless they muted it again."""
        self._held_scheduled = False
        if self.transport is None or self.transport.is_closing() or self._must_pause():
            return  # still muted: the next _update_reading schedules this again
        self._delivering_held = True
        try:
            self._deliver(self.decoder.received(0))
        finally:
            self._delivering_held = False

    def _dispatch(self, frame: protocol.Frame, received: float) -> None:
        if isinstance(frame, protocol.OversizeRequest):
            limit = self.decoder.max_frame_bytes
            err: PymqError = MessageTooLargeError(f"request of {frame.size} bytes exceeds socket.request.max.bytes {limit}")
            self._respond(frame.correlation_id, (error_fields(err), []))
            return
        if isinstance(frame, protocol.MalformedRequest):
            self._respond(frame.correlation_id, (error_fields(InvalidRequestError(frame.reason)), []))
            return
        timer = RequestTimer(frame.api_key, received, self.loop.time())
        try:
            result = self.broker.handlers.handle(frame, self.session)
        except Exception as err:  # a named error, or a bug, which must not take the connection down
            result = error_result(err)
        timer.local_done = self.loop.time()
        if isinstance(result, DelayedOperation):
            self._hold(frame)
            result.on_complete = partial(self._delayed_done, frame, result, timer)
            self._parked[result] = frame
            self._update_reading()
        elif isinstance(result, Awaitable):
            self._hold(frame)
            task = self.loop.create_task(self._finish(frame, result, timer))
            self.in_flight.add(task)
            task.add_done_callback(self._task_done)
            self._update_reading()
        else:
            self._respond(frame.correlation_id, result, timer)

    def _hold(self, frame: protocol.Request) -> None:
        """A request that is not answered at once keeps its bytes: count them against
        queued.max.request.bytes until its response is out (`_unhold`). The request that spends
        the budget stops every connection's reads, not only those that hold requests."""
        memory = self.broker.request_memory
        spent_before = memory.exhausted
        memory.acquire(frame.payload.nbytes)
        self._produces += frame.api_key == ApiKey.PRODUCE
        if memory.exhausted and not spent_before:
            for conn in list(self.broker.connections):
                conn._update_reading()

    def _unhold(self, frame: protocol.Request) -> None:
        self._produces -= frame.api_key == ApiKey.PRODUCE
        self.broker.request_memory.release(frame.payload.nbytes)

    def _delayed_done(self, frame: protocol.Request, op: DelayedOperation, timer: RequestTimer, answer: Any,
                      error: BaseException | None) -> None:
        del self._parked[op]
        timer.remote_done = self.loop.time()
        self._respond(frame.correlation_id, to_result(answer) if error is None else error_result(error), timer)
        self._unhold(frame)
        self._update_reading()

    async def _finish(self, frame: protocol.Request, pending: Awaitable[Result], timer: RequestTimer) -> None:
        try:
            result = await pending
        except Exception as err:  # CancelledError is a BaseException: it propagates
            result = error_result(err)
        finally:
            self._unhold(frame)
        timer.local_done = self.loop.time()  # awaited work (a log append on the writer thread) is local
        self._respond(frame.correlation_id, result, timer)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._update_reading()

    @property
    def waiting(self) -> int:
        """Requests read but not answered yet."""
        return len(self.in_flight) + len(self._parked)

    def expired(self, now: float) -> str | None:
        """Why the connection is to be closed now, if it is: a request not received whole within
        request.read.timeout.ms (while the broker reads it), or idle for connections.max.idle.ms."""
        config = self.broker.config
        if (self._frame_started is not None and not self._read_paused
                and now - self._frame_started > config["request.read.timeout.ms"] / 1000):
            return "a request did not arrive whole within request.read.timeout.ms"
        if not self.waiting and now - self.last_active > config["connections.max.idle.ms"] / 1000:
            return "idle for connections.max.idle.ms"
        return None

    def _update_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        should_pause = self._must_pause()
        if should_pause and not self._read_paused:
            self.transport.pause_reading()
        elif not should_pause and self._read_paused:
            if self.decoder.buffered_bytes and not self._delivering_held:
                # Held frames first, the socket after them: a transport may read before a
                # call_soon callback runs (uvloop reads in its poll phase), and a decoder whose
                # scratch buffer is full of held frames would have no room to offer get_buffer,
                # which the transport takes as a fatal error on the connection.
                if not self._held_scheduled:
                    self._held_scheduled = True
                    self.loop.call_soon(self._deliver_held)
                return
            self.transport.resume_reading()
            if self.decoder.buffered_bytes:
                self._frame_started = self.loop.time()  # the time reading was paused is not the client's
        self._read_paused = should_pause

    def _must_pause(self) -> bool:
        return (self._stopped_reading or self._write_paused
                or self.waiting + len(self._queue) >= self.broker.config["queued.max.requests"]
                or self._over_budget() or self._frame_waits_for_budget())

    def stop_reading(self) -> None:
        """For good (a stopping broker): requests already read are still answered."""
        self._stopped_reading = True
        self._update_reading()

    def _over_budget(self) -> bool:
        """Whether a broker-wide byte budget this connection feeds is spent: the requests held by
        every connection, for a connection with produces in flight, the log writer's queue
        (Kafka mutes such channels), and for one with responses queued, the descriptors queued
        responses hold. The spent budget calls `_update_reading` again when it has
        room."""
        # A frame whose size is reserved is read on: its bytes count already, and they may be
        # what spent the budget.
        budgets = [] if self.decoder.reserved_bytes else [self.broker.request_memory]
        if self._produces:
            budgets.append(self.broker.writer.queue)
        if self._queue:
            budgets.append(self.broker.response_descriptors)
        for budget in budgets:
            if budget.exhausted:
                budget.wake_when_available(self._update_reading)
                return True
        return False

    def _frame_waits_for_budget(self) -> bool:
        """Whether the large frame whose header the decoder holds waits for room in
        queued.max.request.bytes (woken by the budget once it has less in use)."""
        waiting = self.decoder.waiting_bytes
        memory = self.broker.request_memory
        if not waiting or memory.has_room(waiting):
            return False
        memory.wake_when_available(self._update_reading)
        return True

    # -- responses -------------------------------------------------------------------------------

    def _respond(self, correlation_id: int, result: Result, timer: RequestTimer | None = None) -> None:
        if result is None:  # no response (acks=0)
            if timer is not None:
                self.broker.request_metrics.record(timer, None, self.loop.time())
            return
        control, parts = result
        if self.transport is None or self.transport.is_closing():
            _release(parts)
            return
        size = sum(p.size if isinstance(p, FetchSlice) else len(p) for p in parts)
        try:
            header = protocol.encode_response(correlation_id, control, size)
        except (ValueError, OverflowError, struct.error) as err:
            # A frame's size is an int32: a response that cannot be framed gets a named error.
            _release(parts)
            too_large = MessageTooLargeError(f"response of {size} payload bytes cannot be framed: {err}")
            control, parts, size = error_fields(too_large), [], 0
            header = protocol.encode_response(correlation_id, control, size)
        self.last_active = self.loop.time()
        # Queue (as file ranges, not bytes) while a response is being sent with sendfile or while
        # the client is not reading: a slow reader then costs references, not fetched data.
        if (self._writer is not None or self._write_paused
                or (self.broker.zero_copy and any(isinstance(p, FetchSlice) for p in parts))):
            descriptors = sum(isinstance(p, FetchSlice) and p.file is not None for p in parts)
            self.broker.response_descriptors.acquire(descriptors)
            self._queue.append(QueuedResponse(header, parts, descriptors, timer, control))
            if self._writer is None:
                self._writer = self.loop.create_task(self._drain_queue())
            return
        try:
            _write_copied(self.transport, header, parts)
        except Exception as err:  # a read error of the log directory, or a range that came back short
            self._abort(correlation_id, err)
        finally:
            _release(parts)
        if timer is not None:
            self.broker.request_metrics.record(timer, control, self.loop.time())

    def _abort(self, correlation_id: int, err: BaseException) -> None:
        """A response could not be sent whole: drop the connection rather than leave the client
        waiting for it (it reconnects and retries)."""
        log.warning("aborting connection %s: response %d failed: %r", self.peer, correlation_id, err)
        if self.transport is not None:
            self.transport.abort()

    async def _drain_queue(self) -> None:
        """Write queued responses in order once the socket takes data: with sendfile on a dup of the
        socket (`zero.copy`), else through the transport with segment ranges read by pread."""
        transport = self.transport
        assert transport is not None
        sock = _dup_socket(transport) if self.broker.zero_copy else None
        try:
            while self._queue:
                await self._writable.wait()
                queued = self._queue.popleft()
                try:
                    if sock is None:
                        _write_copied(transport, queued.header, queued.parts)
                    else:
                        await self._send_direct(transport, sock, queued.header, queued.parts)
                finally:
                    self._dequeued(queued)
                if queued.timer is not None:
                    self.broker.request_metrics.record(queued.timer, queued.control, self.loop.time())
                self._update_reading()  # one fewer response in flight, its descriptors given back
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a half-sent response cannot be recovered: the client retries
            self._abort(-1, err)
        finally:
            self._writer = None
            if sock is not None:
                sock.close()

    def _dequeued(self, queued: QueuedResponse) -> None:
        """A queued response is sent, or never will be: close its ranges' descriptors."""
        _release(queued.parts)
        self.broker.response_descriptors.release(queued.descriptors)

    async def _send_direct(self, transport: asyncio.Transport, sock: socket.socket, header: bytes,
                           parts: list[Part]) -> None:
        """Send one response past the transport, after whatever the transport still holds."""
        while transport.get_write_buffer_size():
            await self._socket_writable(sock)
        await self._send_bytes(sock, header, MSG_MORE if parts else 0)
        for i, part in enumerate(parts):
            if isinstance(part, FetchSlice):
                await self._send_file(sock, part)
            else:
                await self._send_bytes(sock, part, MSG_MORE if i + 1 < len(parts) else 0)

    async def _send_bytes(self, sock: socket.socket, data: bytes | bytearray | memoryview, flags: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            try:
                view = view[sock.send(view, flags):]
            except BlockingIOError:
                await self._socket_writable(sock)

    async def _send_file(self, sock: socket.socket, part: FetchSlice) -> None:
        """A segment range must go out whole or the frame would lie about its size."""
        if not part.size:
            return
        assert part.file is not None
        position, end = part.position, part.position + part.size
        while position < end:
            try:
                sent = os.sendfile(sock.fileno(), part.file.fileno(), position, end - position)
            except BlockingIOError:
                await self._socket_writable(sock)
                continue
            if not sent:
                raise KafkaStorageError(f"segment range ended {end - position} of {part.size} bytes short "
                                        "(truncated under the send)")
            position += sent

    async def _socket_writable(self, sock: socket.socket) -> None:
        """Wait until the socket takes bytes again. Meanwhile the connection is write-paused, as if
        the transport's buffer were full: reading stops and new responses queue."""
        waiter = self.loop.create_future()
        self.loop.add_writer(sock.fileno(), _set_done, waiter)
        self.pause_writing()
        try:
            await waiter
        finally:
            self.loop.remove_writer(sock.fileno())
            self.resume_writing()


def _address_of(peername: Any) -> str:
    """The client's IP address, one spelling per address (a non-IP peer: its name as given)."""
    host = peername[0] if isinstance(peername, tuple) and peername else peername
    try:
        return normalize_address(str(host))
    except ValueError:
        return str(host)


def _dup_socket(transport: asyncio.Transport) -> socket.socket | None:
    """A descriptor of the transport's socket owned by the sender: the transport may close its own
    (connection lost) while a send waits, and the number must not be reused under it. None if the
    transport has no socket to send on."""
    raw = transport.get_extra_info("socket")
    if raw is None:
        return None
    sock = socket.socket(fileno=os.dup(raw.fileno()))
    sock.setblocking(False)
    return sock


def _set_done(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _write_copied(transport: asyncio.Transport, header: bytes, parts: list[Part]) -> None:
    """Write a response through the transport, segment ranges read with pread (on the loop: the
    path of `zero.copy` off). A range that comes back short raises and nothing is written: the
    frame header already promised its size."""
    data = [header, *(p.read_bytes() if isinstance(p, FetchSlice) else p for p in parts)]
    for part, chunk in zip(parts, data[1:]):
        if isinstance(part, FetchSlice) and len(chunk) != part.size:
            raise KafkaStorageError(f"read {len(chunk)} of {part.size} bytes of a segment range "
                                    "(truncated under the read)")
    transport.writelines(data)


def _release(parts: list[Part]) -> None:
    """Close the descriptors the segment ranges of a response own (sent, or never to be)."""
    for part in parts:
        if isinstance(part, FetchSlice):
            part.close()


