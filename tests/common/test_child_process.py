"""ChildProcess.pause: it returns only once every thread of the child has stopped, so a request
sent right after it cannot be answered by a thread that was still running on another core."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from common.child_process import ChildProcess, _all_threads_stopped
from tests.waiting import wait_until

SPIN = """
import threading
def spin():
    while True:
        pass
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
spin()
"""


class Spinner(ChildProcess):
    what = "spinner"

    def __init__(self, output: Path) -> None:
        self.output = output
        self.proc = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_pause_returns_with_every_thread_stopped_and_resume_runs_them_again(tmp_path: Path) -> None:
    spinner = Spinner(tmp_path / "spin.out")
    try:
        wait_until(lambda: len(list(Path(f"/proc/{spinner.pid}/task").iterdir())) >= 4, 30,
                   "the child's four threads spinning")
        for _ in range(20):
            spinner.pause()
            assert _all_threads_stopped(spinner.pid)
            spinner.resume()
        assert spinner.proc is not None and spinner.proc.poll() is None
    finally:
        spinner.kill()
