"""The `pymq` CLI (cli): help for every command, input errors without a broker, pure
helpers, and every command against a real broker process started with `pymq broker start`."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest
from click.testing import CliRunner, Result

from cli import cli
from cli.common import producer_config
from cli.consume import Timestamp, bytes_text, csv_bytes, json_bytes, json_lines, raw_lines, text_lines
from cli.loadgen import PayloadPool, latency_summary
from cli.produce import MissingSeparatorError, lines_without_separator, split_lines
from client import RECORD_SCHEMA
from broker.config import BROKER_CONFIGS
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"listening on ([\d.]+):(\d+)")
START_TIMEOUT_S = 20
STOP_TIMEOUT_S = 10


def run(*args: str, input: str | bytes | None = None) -> Result:
    """Run the CLI in-process, its output captured: not a terminal, so no table is cut to a width."""
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


# -- help ----------------------------------------------------------------------------------------

HELP_CASES = [
    ([], "Kafka-like broker"),
    (["broker"], "Run a broker"),
    (["broker", "start"], "Start a broker in the foreground"),
    (["broker", "configs"], "every broker config key"),
    (["topic"], "Create, list, describe, alter and delete topics"),
    (["topic", "create"], "Create topic NAME"),
    (["topic", "list"], "List topic names"),
    (["topic", "describe"], "partitions (leader, epoch, replicas, ISR"),
    (["topic", "alter"], "Add partitions"),
    (["topic", "delete"], "Delete topics and all their data"),
    (["produce"], "as one record"),
    (["consume"], "Print records of TOPIC"),
    (["perf"], "Measure producer throughput"),
    (["perf", "produce"], "send-to-ack"),
    (["perf", "consume"], "time from start-up to the first record"),
]


@pytest.mark.parametrize("command, purpose", HELP_CASES, ids=[" ".join(c) or "pymq" for c, _ in HELP_CASES])
def test_help_explains_every_command(command: list[str], purpose: str) -> None:
    """`--help` on every group and command exits 0 and states what it is for."""
    result = run(*command, "--help")
    assert result.exit_code == 0, result.output
    assert purpose in " ".join(result.stdout.split())


# -- input errors, no broker needed --------------------------------------------------------------

INPUT_ERRORS = [
    (["broker", "start", "-o", "port"], 2, "'port' is not KEY=VALUE"),
    (["broker", "start", "-o", "no.such.key=1"], 1, "error: INVALID_CONFIG: unknown broker config 'no.such.key'"),
    (["broker", "start", "-o", "port=http"], 1, "error: INVALID_CONFIG: port: 'http' is not a valid int"),
    (["broker", "start", "--config", "/nonexistent.toml"], 2, "does not exist"),
    (["topic", "create", "t", "-c", "retention.mss=5"], 1, "error: INVALID_CONFIG: unknown topic config 'retention.mss'"),
    (["topic", "create", "t", "-c", "retention.ms=soon"], 1, "error: INVALID_CONFIG: retention.ms"),
    (["topic", "create", "bad name"], 1, "error: INVALID_TOPIC_EXCEPTION: illegal topic name"),
    (["topic", "alter", "t"], 2, "nothing to alter"),
    (["topic", "alter", "t", "--delete-config", "nope"], 1, "error: INVALID_CONFIG: unknown topic config 'nope'"),
    (["consume", "t", "--from-beginning", "--offset", "3"], 2, "at most one of"),
    (["consume", "t", "--timestamp", "yesterday"], 2, "neither milliseconds nor an ISO 8601"),
    (["perf", "produce", "t", "-n", "1", "-s", "1", "--producer-props", "bogus=1"], 1,
     "error: ValueError: unknown producer property 'bogus'"),
    (["-b", "nohost", "topic", "list"], 1, "error: ValueError: bootstrap server 'nohost' must look like host:port"),
    (["topic", "list", "-b", "127.0.0.1:1"], 1, "error: NETWORK_EXCEPTION: no broker reachable"),
]


@pytest.mark.parametrize("args, exit_code, message", INPUT_ERRORS, ids=[" ".join(a) for a, _, _ in INPUT_ERRORS])
def test_bad_input_is_a_clear_error(args: list[str], exit_code: int, message: str) -> None:
    """Bad options exit 2 (usage); operating errors print one `error: NAME: ...` line and exit 1."""
    result = run(*args)
    assert result.exit_code == exit_code
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_broker_configs_lists_every_key() -> None:
    """`broker configs` shows every broker config key with its default."""
    result = run("broker", "configs")
    assert result.exit_code == 0
    for name in BROKER_CONFIGS:
        assert name in result.stdout
    assert "2^63-1" in result.stdout


# -- pure helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lines, separator, expected",
    [
        ([b"a\n", b"b"], None, [(None, b"a"), (None, b"b")]),
        ([b"k:v\n", b"k2:v:2\r\n"], b":", [(b"k", b"v"), (b"k2", b"v:2")]),
        ([b"\n"], None, [(None, b"")]),
        ([b"k::v\n"], b"::", [(b"k", b"v")]),
    ],
    ids=["no-separator", "first-separator-wins", "empty-line", "multi-byte-separator"],
)
def test_split_lines_strips_newline_and_splits_at_first_separator(lines, separator, expected) -> None:
    """Each line becomes (key, value) with its newline removed."""
    assert list(split_lines(lines, separator)) == expected


def test_split_lines_names_a_line_without_separator() -> None:
    """A missing separator is a ValueError naming the line number, raised after the lines before it."""
    lines = split_lines([b"k|v\n", b"oops\n", b"k2|v2\n"], b"|")
    assert next(lines) == (b"k", b"v")
    with pytest.raises(MissingSeparatorError, match="line 2 has no key separator") as raised:
        next(lines)
    assert isinstance(raised.value, ValueError) and raised.value.line_number == 2


def test_lines_without_separator_lists_the_first_ten_and_counts_all() -> None:
    """The pre-send check names the first 10 bad lines (1-based) and counts every one; a newline
    never counts as part of the line."""
    lines = [b"k|v\n" if i % 2 else b"bad\n" for i in range(30)] + [b"last-no-newline|v", b"|\r\n"]
    assert lines_without_separator(lines, b"|") == ([1, 3, 5, 7, 9, 11, 13, 15, 17, 19], 15)
    assert lines_without_separator([b"a\n"], b"\n") == ([1], 1)
    assert lines_without_separator([], b"|") == ([], 0)


@pytest.mark.parametrize(
    "text, expected_ms",
    [("1700000000000", 1_700_000_000_000), ("2023-11-14T22:13:20", 1_700_000_000_000),
     ("2023-11-14T22:13:20Z", 1_700_000_000_000), ("2023-11-15T00:13:20+02:00", 1_700_000_000_000)],
    ids=["ms", "naive-is-utc", "zulu", "offset"],
)
def test_timestamp_option_takes_ms_or_iso8601(text: str, expected_ms: int) -> None:
    """--timestamp accepts epoch milliseconds or ISO 8601 (UTC unless an offset is given)."""
    assert Timestamp().convert(text, None, None) == expected_ms


def _records(keys: list[bytes | None], values: list[bytes | None]) -> pa.Table:
    n = len(values)
    return pa.table({
        "topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array([1_700_000_000_000] * n, pa.int64()).cast(RECORD_SCHEMA.field("timestamp").type),
        "timestamp_type": pa.array([0] * n, pa.int8()), "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()), "headers": pa.nulls(n, RECORD_SCHEMA.field("headers").type),
    }, schema=RECORD_SCHEMA)


def test_print_formats_show_undecodable_bytes_safely_and_mark_base64() -> None:
    """utf8 replaces invalid UTF-8; hex and base64 encode every byte; auto keeps valid UTF-8 as
    text and marks base64 (an object in JSON); raw prints the bytes; a missing key is null."""
    table = _records([None, b"k"], [b"\xff\xfe", b"ok"])
    assert text_lines(table, bytes_text("utf8"), True, True, "|") == "0:0|null|\ufffd\ufffd\n0:1|k|ok\n"
    assert text_lines(table, bytes_text("hex"), True, False, "|") == "null|fffe\n6b|6f6b\n"
    assert text_lines(table, bytes_text("auto"), False, False, "|") == "base64://4=\nok\n"
    assert raw_lines(table, True, False, b"|") == b"null|\xff\xfe\nk|ok\n"
    auto = [json.loads(line) for line in json_lines(table, json_bytes("auto")).splitlines()]
    assert [(r["key"], r["value"]) for r in auto] == [(None, {"base64": "//4="}), ("k", "ok")]
    base64_only = [json.loads(line) for line in json_lines(table, json_bytes("base64")).splitlines()]
    assert [(r["key"], r["value"]) for r in base64_only] == [(None, "//4="), ("aw==", "b2s=")]


def test_csv_has_header_once_and_utf8_key_value() -> None:
    """CSV output: header only when asked, key/value as text even when bytes are invalid UTF-8."""
    table = _records([b"k", None], [b"v", b"\xff"])
    first = csv_bytes(table, include_header=True).decode()
    assert first.splitlines()[0] == '"topic","partition","offset","timestamp","key","value"'
    assert '"k","v"' in first and "\ufffd" in first
    assert not csv_bytes(table, include_header=False).decode().startswith('"topic"')
    assert '"6b","76"' in csv_bytes(table, include_header=False, bytes_format="hex").decode()


def test_payload_pool_tables_slice_one_buffer() -> None:
    """Generated tables have the requested rows and value size and share the pool's memory."""
    pool = PayloadPool(record_size=10, max_rows=100, seed=1)
    table = pool.table(100, chunk_number=3)
    values = table.column("value").to_pylist()
    assert len(values) == 100 and {len(v) for v in values} == {10}
    assert table.column("value").chunk(0).buffers()[2].address == pool.buffer.address
    assert all(len(v) == 10 for v in pool.values(5))


def test_latency_summary_percentiles() -> None:
    """Percentiles are ordered and the max is the largest sample; no samples give zeros."""
    stats = latency_summary([float(i) for i in range(1, 1001)])
    assert stats["avg"] == 500.5 and stats["max"] == 1000.0
    assert stats["p50"] <= stats["p95"] <= stats["p99"] <= stats["p99_9"] <= stats["max"]
    assert latency_summary([])["p99"] == 0.0


def test_producer_config_flags_win_over_props() -> None:
    """--producer-props accepts dotted names and numbers; explicit flags override them."""
    config = producer_config({"acks": "all", "linger_ms": None}, (("linger.ms", "20"), ("acks", "0")))
    assert config == {"acks": "all", "linger_ms": 20}


# -- against a real broker process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker started as `python -m cli broker start`; yields its bootstrap address and is
    stopped by PID (SIGTERM, then SIGKILL after 10 s)."""
    log_dir = tmp_path_factory.mktemp("cli-broker")
    stderr = open(log_dir.parent / "cli-broker.err", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "broker", "start", "-o", "port=0", "-o", "metrics.port=0", "-o",
         f"log.dir={log_dir}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
    )
    try:
        port = _wait_until_listening(proc, Path(stderr.name))
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)
        stderr.close()


def _wait_until_listening(proc: subprocess.Popen[str], stderr_path: Path) -> int:
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            match = READY.search(lines.get(timeout=0.1))
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        if match:
            return int(match.group(2))
    raise RuntimeError(f"broker did not start:\n{stderr_path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_topic_create_list_describe_alter_delete(cli_broker: str) -> None:
    """A topic's whole life through the CLI: configs are marked as overrides, partitions grow,
    deletion asks first."""
    b = ["-b", cli_broker]
    assert run(*b, "topic", "create", "life", "-p", "2", "-c", "retention.ms=3600000").exit_code == 0
    assert "life" in run(*b, "topic", "list").stdout.split()
    duplicate = run(*b, "topic", "create", "life")
    assert duplicate.exit_code == 1 and "error: TOPIC_ALREADY_EXISTS" in duplicate.stderr

    described = run(*b, "topic", "describe", "life").stdout
    assert "partitions 2" in described
    assert re.search(r"retention\.ms\s*│\s*3600000\s*│\s*override", described)

    altered = run(*b, "topic", "alter", "life", "--add-partitions", "1", "-c", "segment.bytes=1048576",
                  "--delete-config", "retention.ms")
    assert altered.exit_code == 0 and "now has 3 partitions" in altered.stdout
    described = run(*b, "topic", "describe", "life").stdout
    assert "partitions 3" in described
    assert re.search(r"segment\.bytes\s*│\s*1048576\s*│\s*override", described)
    assert re.search(r"retention\.ms\s*│\s*\d+\s*│\s*default", described)

    declined = run(*b, "topic", "delete", "life", input="n\n")
    assert declined.exit_code == 1 and "life" in run(*b, "topic", "list").stdout.split()
    assert run(*b, "topic", "delete", "life", "--yes").exit_code == 0
    assert "life" not in run(*b, "topic", "list").stdout.split()
    missing = run(*b, "topic", "describe", "life")
    assert missing.exit_code == 1 and "error: UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr


def test_describe_shows_log_offsets(cli_broker: str, tmp_path: Path) -> None:
    """The partition table's end offsets add up to the records produced."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "offsets", "-p", "1")
    source = tmp_path / "in.txt"
    source.write_text("".join(f"v{i}\n" for i in range(7)))
    assert run(*b, "produce", "offsets", "--file", str(source)).exit_code == 0
    assert re.search(r"│\s*0\s*│\s*0\s*│\s*\d+\s*│\s*0\s*│\s*0\s*│\s*0\s*│\s*7\s*│", run(*b, "topic", "describe", "offsets").stdout)


def test_produce_file_with_keys_then_consume_json(cli_broker: str, tmp_path: Path) -> None:
    """Lines split at the key separator come back as JSON with keys, values ({"base64": ...} when
    not UTF-8), headers, ISO timestamps and per-partition increasing offsets."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "keyed", "-p", "3")
    source = tmp_path / "records.txt"
    source.write_bytes(b"".join(f"user-{i}|event {i}\n".encode() for i in range(50)) + b"raw|\xff\xfe\n")
    produced = run(*b, "produce", "keyed", "--file", str(source), "--key-separator", "|", "-H", "origin=test",
                   "--linger-ms", "1", "--acks", "all")
    assert produced.exit_code == 0 and "produced 51 records to keyed" in produced.stderr

    consumed = run(*b, "consume", "keyed", "--from-beginning", "--max-messages", "51", "--format", "json")
    assert consumed.exit_code == 0 and "consumed 51 records" in consumed.stderr
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    by_key = {r["key"]: r for r in records}
    assert len(records) == 51 and by_key["user-7"]["value"] == "event 7"
    assert by_key["raw"]["value"] == {"base64": "//4="}  # marked: never mistaken for text
    assert all(r["headers"] == [["origin", "test"]] and r["topic"] == "keyed" for r in records)
    datetime.fromisoformat(records[0]["timestamp"])
    for partition in {r["partition"] for r in records}:
        offsets = [r["offset"] for r in records if r["partition"] == partition]
        assert offsets == list(range(len(offsets)))


def test_consume_text_from_offset_and_csv(cli_broker: str) -> None:
    """Text output with --print-offset/--print-key starts at --offset; CSV has one header row."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "plain", "-p", "1")
    assert run(*b, "produce", "plain", "--key-separator", "=", input="a=1\nb=2\nc=3\n").exit_code == 0
    text = run(*b, "consume", "plain", "--offset", "1", "-n", "2", "--print-offset", "--print-key")
    assert text.stdout == "0:1\tb\t2\n0:2\tc\t3\n"
    csv = run(*b, "consume", "plain", "--from-beginning", "-n", "3", "--format", "csv").stdout.splitlines()
    assert csv[0].startswith('"topic"') and len(csv) == 4 and csv[3].endswith('"c","3"')


def _stored(bootstrap: str, topic: str) -> list[str]:
    """Every record of `topic` as `key<TAB>value`, read until the topic is idle."""
    result = run("-b", bootstrap, "consume", topic, "--from-beginning", "--timeout-ms", "500", "--print-key")
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_produce_from_stdin_file_with_a_bad_line_stores_nothing(cli_broker: str) -> None:
    """Seekable stdin (here in-process) is checked before sending: a line missing the separator
    fails with an error naming it and saying nothing was sent, and the topic stays empty."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "strict", "-p", "1")
    result = run(*b, "produce", "strict", "--key-separator", ":", input="a:1\nnokey\nb:2\n")
    assert result.exit_code == 1
    assert "error: ValueError: line 2 has no key separator ':'; nothing was sent" in result.stderr
    assert _stored(cli_broker, "strict") == []


def test_produce_file_with_many_bad_lines_names_the_first_and_stores_nothing(cli_broker: str, tmp_path: Path) -> None:
    """--file with 12 bad lines among 36: the error lists the first 10 line numbers and counts the
    rest, nothing is stored; the corrected file then goes in whole."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "checked", "-p", "2")
    bad = [2, 5, 6, 9, 13, 14, 20, 21, 27, 30, 33, 36]
    source = tmp_path / "in.txt"
    source.write_text("".join(f"v{i}\n" if i in bad else f"k{i}=v{i}\n" for i in range(1, 37)))
    result = run(*b, "produce", "checked", "--file", str(source), "--key-separator", "=")
    assert result.exit_code == 1
    named = ", ".join(map(str, bad[:10]))
    assert f"error: ValueError: lines {named} and 2 more have no key separator '='; nothing was sent" in result.stderr
    assert _stored(cli_broker, "checked") == []

    source.write_text("".join(f"k{i}=v{i}\n" for i in range(1, 37)))
    assert run(*b, "produce", "checked", "--file", str(source), "--key-separator", "=").exit_code == 0
    assert sorted(_stored(cli_broker, "checked")) == sorted(f"k{i}\tv{i}" for i in range(1, 37))


def test_produce_from_a_pipe_stops_at_a_bad_line_and_reports_what_was_stored(cli_broker: str) -> None:
    """A pipe is streamed: the first bad line (4) stops the command with exit 1 once lines 1-3 are
    acknowledged; the message says so, and the topic holds exactly those three records."""
    run("-b", cli_broker, "topic", "create", "streamed", "-p", "1")
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "produce", "streamed", "--key-separator", ":", "-b", cli_broker],
        input=b"a:1\nb:2\nc:3\nnokey\nd:4\n", capture_output=True, cwd=REPO, timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert ("error: ValueError: line 4 has no key separator ':'; stopped there: lines 1-3 (3 records) were stored, "
            "nothing from line 4 on was sent") in proc.stderr.decode()
    assert _stored(cli_broker, "streamed") == ["a\t1", "b\t2", "c\t3"]


def test_consume_until_idle_timeout(cli_broker: str) -> None:
    """With --timeout-ms and nothing new, consume from latest stops and reports zero records."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "quiet", "-p", "1")
    started = time.monotonic()
    result = run(*b, "consume", "quiet", "--timeout-ms", "300")
    assert result.exit_code == 0 and "consumed 0 records" in result.stderr
    assert time.monotonic() - started < 5


def test_perf_produce_and_consume_report_json(cli_broker: str) -> None:
    """perf produce (per-record and columnar) and perf consume print parseable results that
    account for every record."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "bench", "-p", "3")
    sent = json.loads(run(*b, "perf", "produce", "bench", "-n", "20000", "-s", "100", "--json").stdout)
    assert sent["records"] == 20000 and sent["mode"] == "send" and sent["records_per_s"] > 0
    assert sent["latency_samples"] >= 10000
    assert 0 < sent["latency_p50_ms"] <= sent["latency_p99_ms"] <= sent["latency_max_ms"]

    batch = json.loads(run(*b, "perf", "produce", "bench", "-n", "20000", "-s", "100", "--mode", "batch",
                           "--compression", "lz4", "--json").stdout)
    assert batch["records"] == 20000 and batch["latency_samples"] >= 1 and batch["compression"] == "lz4"

    for mode in ("arrow", "records"):
        got = json.loads(run(*b, "perf", "consume", "bench", "--mode", mode, "--json").stdout)
        assert got["records"] == 40000 and got["bytes"] == 40000 * 100 and not got["timed_out"]
        assert got["first_record_ms"] > 0 and got["mb_per_s"] > 0


def test_perf_produce_summary_table(cli_broker: str) -> None:
    """Without --json, perf produce prints a summary table of rates and latency percentiles."""
    b = ["-b", cli_broker]
    run(*b, "topic", "create", "bench-table", "-p", "1")
    result = run(*b, "perf", "produce", "bench-table", "-n", "1000", "-s", "10", "--throughput", "5000")
    assert result.exit_code == 0
    for metric in ("records_per_s", "mb_per_s", "latency_p99_9_ms", "latency_max_ms"):
        assert metric in result.stdout


def test_piped_tables_are_never_cut_to_a_terminal_width(cli_broker: str) -> None:
    """`topic describe`, `group describe` and `broker configs` as a pipe reads them, from a
    subprocess: every long cell whole, on one line, no ellipsis (rich cut them to 80 columns)."""
    from client import Admin

    topic = "piped-" + "t" * 200
    with Admin(cli_broker) as admin:
        admin.create_topic(topic, partitions=1)
        admin.alter_group_offsets("piped-group", {(topic, 0): 0})

    def piped(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env={**os.environ, "COLUMNS": "80"})
        assert done.returncode == 0, done.stderr
        assert "…" not in done.stdout
        return done.stdout

    assert any(topic in line for line in piped("-b", cli_broker, "topic", "describe", topic).splitlines())
    assert any(line.split()[:2] == [topic, "0"] for line in piped("-b", cli_broker, "group", "describe",
                                                                  "piped-group").splitlines())
    configs = piped("broker", "configs")
    longest = max(BROKER_CONFIGS.values(), key=lambda c: len(c.doc))
    assert any(longest.doc in line for line in configs.splitlines()), longest.name


# -- Ctrl-C ----------------------------------------------------------------------------------------


def _cli_process(*args: str, stdin: Any = subprocess.DEVNULL, stdout: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    # Unbuffered: communicate() reads the pipes' descriptors, past any read-ahead a buffer would hold.
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, stdin=stdin, stdout=stdout,
                            stderr=subprocess.PIPE, bufsize=0)


def test_consume_interrupted_reports_exactly_the_records_it_printed(cli_broker: str) -> None:
    """Ctrl-C while a batch is being written to a full pipe: the batch is written whole, then
    consume stops, and the count on stderr is the number of lines printed (it reported 135,631
    after printing 818,709: the write cut short by the signal, and the batch not counted)."""
    from client import Producer

    run("-b", cli_broker, "topic", "create", "interrupted", "-p", "2")
    with Producer(cli_broker) as producer:
        for p in range(2):
            producer.send_batch("interrupted", pa.table({"value": [b"v%d" % i for i in range(100_000)]}), partition=p)
        producer.flush()
    proc = _cli_process("-b", cli_broker, "consume", "interrupted", "--from-beginning")
    assert proc.stdout is not None
    head = b""
    while len(head) < 100_000:  # then the pipe fills: consume blocks mid-batch, where Ctrl-C lands
        head += proc.stdout.read(100_000 - len(head))
    proc.send_signal(signal.SIGINT)
    rest, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    printed = (head + rest).count(b"\n")
    assert f"consumed {printed} records" in stderr.decode()  # the batch cut by Ctrl-C was printed whole


def test_consume_as_a_group_member_commits_what_it_printed_and_leaves_on_ctrl_c(cli_broker: str, tmp_path: Path) -> None:
    """`consume --group`: the group assigns the partitions; after Ctrl-C the group is Empty at
    once (the member left, no session timeout) with the printed records' offsets committed, and
    the next member of the group starts after them."""
    from client import Admin, Producer

    run("-b", cli_broker, "topic", "create", "grouped", "-p", "2")
    with Producer(cli_broker) as producer:
        for i in range(40):
            producer.send("grouped", b"g%d" % i, partition=i % 2)
    out = tmp_path / "group.txt"
    with out.open("wb") as sink:
        proc = _cli_process("-b", cli_broker, "consume", "grouped", "--group", "console", "--from-beginning", stdout=sink)
        wait_until(lambda: out.read_bytes().count(b"\n") == 40, 60, "the member prints the 40 records")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "consumed 40 records" in stderr.decode(), stderr
    with Admin(cli_broker) as admin:
        (group,) = admin.describe_groups(["console"])
        assert group.state == "Empty" and not group.members
        assert {tp: o.offset for tp, o in admin.list_group_offsets("console").items()} == {("grouped", 0): 20,
                                                                                           ("grouped", 1): 20}
    again = run("-b", cli_broker, "consume", "grouped", "--group", "console", "--from-beginning", "--timeout-ms", "1500")
    assert again.exit_code == 0 and "consumed 0 records" in again.stderr
    assert run("-b", cli_broker, "consume", "grouped", "--group", "g", "--offset", "3").exit_code == 2


def test_produce_interrupted_says_which_lines_were_stored(cli_broker: str) -> None:
    """Ctrl-C while `produce` waits for more input on a pipe: the lines sent so far are
    acknowledged, the message names them, and the topic holds exactly those."""
    run("-b", cli_broker, "topic", "create", "cut-short", "-p", "1")
    proc = _cli_process("-b", cli_broker, "produce", "cut-short", "--linger-ms", "0", stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write(b"".join(b"line-%d\n" % i for i in range(1, 6)))
    proc.stdin.flush()
    wait_until(lambda: len(_stored(cli_broker, "cut-short")) == 5, 60, "the five lines are stored")
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted: lines 1-5 (5 records) were stored, nothing after line 5 was sent" in stderr.decode()
    assert _stored(cli_broker, "cut-short") == [f"null\tline-{i}" for i in range(1, 6)]


def on_terminal(*args: str) -> tuple[int, bytes]:
    """Run the CLI with stderr on a pseudo-terminal: its exit code and what it drew there."""
    import os
    import pty

    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=terminal, env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process is done with it
            break
        if not chunk:
            break
        shown += chunk
    code = proc.wait(60)
    os.close(controller)
    return code, shown


def test_produce_from_a_file_shows_progress_on_a_terminal(cli_broker: str, tmp_path: Path) -> None:
    """With stderr on a terminal, producing a file draws a progress bar of its bytes; the records
    are all stored."""
    run("-b", cli_broker, "topic", "create", "progress", "-p", "1")
    source = tmp_path / "lines.txt"
    source.write_text("".join(f"line-{i}\n" for i in range(5000)))
    code, shown = on_terminal("-b", cli_broker, "produce", "progress", "--file", str(source))
    assert code == 0 and b"produce" in shown and b"produced 5000 records to progress" in shown
    assert re.search(rb"\d+/\d+", shown), shown[-500:]  # rich's completed/total column


def test_reset_offsets_says_which_step_it_is_at_on_a_terminal(cli_broker: str) -> None:
    """A reset over many partitions is a few long requests: a terminal shows the step it is at
    (here quick: rich draws at least the last one)."""
    from client import Admin

    with Admin(cli_broker) as admin:
        admin.create_topic("many", partitions=64)
        admin.alter_group_offsets("resetting", {("many", p): 0 for p in range(64)})
    code, shown = on_terminal("-b", cli_broker, "group", "reset-offsets", "resetting", "--all-topics", "--to-latest",
                              "--execute")
    assert code == 0 and b"committing 64 offsets" in shown, shown[-800:]


def test_consume_isolation_level_hides_aborted_transactions(cli_broker: str) -> None:
    """--isolation-level read_committed prints a committed transaction's records and not an
    aborted one's; read_uncommitted (the default, as Kafka's console consumer) prints both; neither
    prints the markers."""
    from client import Producer

    b = ["-b", cli_broker]
    run(*b, "topic", "create", "txn-cli", "-p", "1")
    with Producer(cli_broker, transactional_id="cli-txn") as producer:
        producer.init_transactions()
        for value, commit in ((b"kept", True), (b"dropped", False)):
            producer.begin_transaction()
            producer.send("txn-cli", value, partition=0)
            producer.flush()  # written either way
            producer.commit_transaction() if commit else producer.abort_transaction()
    committed = run(*b, "consume", "txn-cli", "--from-beginning", "--timeout-ms", "1000",
                    "--isolation-level", "read_committed", "--print-offset")
    assert committed.stdout == "0:0\tkept\n"
    everything = run(*b, "consume", "txn-cli", "--from-beginning", "--timeout-ms", "1000", "--print-offset")
    assert everything.stdout == "0:0\tkept\n0:2\tdropped\n"
