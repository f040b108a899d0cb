"""docs/architecture.md's table of API keys names every key the protocol defines, under its name
(it lacked OffsetForLeaderEpoch, AlterPartitionReassignments and BrokerHandshake once)."""
from __future__ import annotations

import re
from pathlib import Path

from protocol import ApiKey

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _documented() -> dict[int, str]:
    text = ARCHITECTURE.read_text()
    table = text[text.index("| key | API | key | API |"):].split("\n\n", 1)[0]
    cells = re.findall(r"\|\s*(\d+)\s*\|\s*([A-Za-z]+)", table)
    return {int(key): name for key, name in cells}


def test_every_api_key_is_in_the_architecture_table_under_its_name():
    expected = {key.value: key.name.title().replace("_", "") for key in ApiKey}
    assert _documented() == expected
