"""The history checker finds each anomaly it names (and none in a clean history)."""
from __future__ import annotations

from tests.e2e.checker import History


def clean() -> History:
    history = History()
    for i in range(6):
        value = b"v%d" % i
        history.sending(value)
        history.delivered(value, i % 2, i // 2, None)
    for p in (0, 1):
        history.read("final", p, [0, 1, 2], [b"v%d" % (p + 2 * o) for o in range(3)], final=True)
    return history


def test_a_clean_history_has_no_anomaly():
    report = clean().check()
    assert report.ok, str(report)
    assert (report.acknowledged, report.read) == (6, 6)


def test_each_anomaly_is_found():
    history = clean()
    history.sending(b"lost")
    history.delivered(b"lost", 0, 3, None)
    assert [p for p, _ in history.check().lost] == [0]

    history = clean()
    history.read("tail", 0, [0, 1], [b"v0", b"v4"])  # v2 at offset 1 in the final read: two values at 1
    report = history.check()
    assert report.inconsistent and report.duplicated  # v4 at offsets 1 and 2

    history = clean()
    history.read("tail", 1, [1, 0], [b"v3", b"v1"])
    assert history.check().reordered == [("tail", 1, 1, 0)]

    history = clean()
    history.read("other", 1, [5], [b"never-sent"], final=True)
    report = history.check()
    assert report.unknown and report.gaps == [(1, 3), (1, 4)]

    history = History()
    history.sending(b"x")
    history.delivered(b"x", 0, 7, None)
    history.read("final", 0, [8], [b"x"], final=True)
    assert history.check().moved == [(0, b"x", 7, 8)]
