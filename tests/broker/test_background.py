"""Background work outlives its own failures (broker/background.py): a periodic duty that raises
is reported (logged, counted) and runs again; one log's retention bug does not stop the pass for
the others; a group append that fails with a bug still answers the clients waiting on it; a
throttled upload's wait ends when tiering closes; a stop whose step fails still runs every later
step (the logs are closed and log.dir is unlocked)."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

from broker import background
from broker.config import BrokerConfig
from broker.coordinator.runtime import append_error
from common.errors import LogDirInUseError, UnknownServerError
from broker.log.log_dir_lock import LogDirLock
from broker.remote_log.remote_log_manager import CopyThrottle
from broker.server import Broker
from tests.waiting import wait_until_async


def test_a_periodic_duty_that_raises_is_reported_and_runs_again(caplog) -> None:
    """The second round raises; the third and fourth still run, and the error is counted once."""
    rounds: list[int] = []

    def duty() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            raise RuntimeError("boom")

    async def run() -> None:
        task = asyncio.create_task(background.every("test-duty", 0.001, duty))
        await wait_until_async(lambda: len(rounds) >= 4, 10, "four rounds of the duty", 0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    before = background.error_counts().get("test-duty", 0)
    with caplog.at_level(logging.ERROR, logger="pymq.background"):
        asyncio.run(run())
    assert background.error_counts()["test-duty"] == before + 1
    assert "background task test-duty failed" in caplog.text and "RuntimeError: boom" in caplog.text


def test_an_async_duty_is_awaited_and_its_error_reported() -> None:
    calls: list[int] = []

    async def duty() -> None:
        calls.append(1)
        raise ValueError("async boom")

    async def run() -> None:
        task = asyncio.create_task(background.every("test-async-duty", 0.001, duty))
        await wait_until_async(lambda: len(calls) >= 3, 10, "three calls of the duty", 0.001)
        task.cancel()

    asyncio.run(run())
    assert background.error_counts()["test-async-duty"] >= 2


def test_a_bug_below_a_group_append_answers_unknown_server_error() -> None:
    """Join, Sync and Commit wait on the append: a non-pymq exception still gives them an answer."""
    try:
        raise KeyError("bug")
    except KeyError as err:
        answer = append_error(err, "group")
    assert isinstance(answer, UnknownServerError) and "KeyError" in str(answer)


def test_closing_the_throttle_ends_a_wait_at_once() -> None:
    """An upload waiting out a 1 B/s throttle for a 1 GB reservation returns when close() is called."""
    throttle = CopyThrottle(1)
    throttle.acquire(1)  # the bucket is now busy for a second
    waited: list[float] = []
    waiter = threading.Thread(target=lambda: waited.append(throttle.acquire(1 << 30)))
    waiter.start()
    # Not a condition: no sign shows that the thread is inside acquire. Had it not got there yet,
    # acquire after close returns at once too, so a slow machine weakens the test, never fails it.
    time.sleep(0.1)
    started = time.monotonic()
    throttle.close()
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - started < 5


def test_a_failing_stop_step_still_closes_the_logs_and_unlocks_the_dir(tmp_path: Path, monkeypatch, caplog) -> None:
    """The group coordinator's stop raises: the broker logs it, still closes every log and
    releases log.dir, so another broker can take the directory."""
    log_dir = tmp_path / "data"

    async def run() -> None:
        broker = Broker(BrokerConfig.load(overrides={"log.dir": str(log_dir), "port": 0, "event.loop": "asyncio"}))
        await broker.start()

        async def broken_stop() -> None:
            raise RuntimeError("coordinator stop bug")

        monkeypatch.setattr(broker.handlers.groups.runtime, "stop", broken_stop)
        closed: list[bool] = []
        real_close = broker.logs.close
        monkeypatch.setattr(broker.logs, "close", lambda: (closed.append(True), real_close())[1])
        await broker.stop()
        assert closed == [True]

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    assert "stopping: stop the group coordinator failed" in caplog.text
    LogDirLock(log_dir).release()  # free again


def test_a_second_lock_on_a_directory_fails_with_a_named_error(tmp_path: Path) -> None:
    held = LogDirLock(tmp_path)
    with pytest.raises(LogDirInUseError, match="in use by another broker"):
        LogDirLock(tmp_path)
    held.release()
    LogDirLock(tmp_path).release()
