"""Probe: the other client of a flood test, whose answers must keep coming while a hostile one
floods the broker."""
from __future__ import annotations

import threading
import time

from protocol import ApiKey
from tests.helpers.raw_client import RawClient
from tests.waiting import wait_until


class Probe:
    """Metadata for `topic` (which exists) on a connection of its own, again and again, until
    stopped; `worst_s` is its slowest answer."""

    def __init__(self, port: int, topic: str) -> None:
        self.client = RawClient(port, timeout_s=120)
        self.topic = topic
        self.worst_s = 0.0
        self.answers = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                control, _ = self.client.request(ApiKey.METADATA, {"topics": [self.topic]})
                assert control["topics"][0]["error_code"] == 0, control
                self.worst_s = max(self.worst_s, time.monotonic() - started)
                self.answers += 1
                self._stop.wait(0.01)  # a request every 10 ms, not a busy loop
        except BaseException as err:  # re-raised by __exit__: a probe that died proves nothing
            self.error = err

    def __enter__(self) -> "Probe":
        """Started, and answered once (so that it is answered during what follows)."""
        self._thread.start()
        wait_until(lambda: self.answers > 0 or self.error, 60, "the probe's first answer")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(130)
        self.client.close()
        if self.error is not None:
            raise AssertionError("the probe client failed") from self.error
