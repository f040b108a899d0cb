"""A consumer-group member (and a paced producer) run as real processes by the group scenario
tests, plus the reader of the log each member writes.

    python -m tests.broker.group_member consume --bootstrap HOST:PORT --group G --topic T --out FILE
        [--strategy range|roundrobin|cooperative-sticky] [--instance-id ID]
        [--session-timeout-ms 3000] [--heartbeat-interval-ms 300]
        [--commit after|before] [--max-records 500] [--poll-delay-ms 0] [--crash-after-records N]
    python -m tests.broker.group_member produce --bootstrap HOST:PORT --topic T --records N [--rate R]
        [--partitions P] [--first I]

A member subscribes to the topic, processes what `poll()` returns and appends one line per
processed record, "topic partition offset", to its output file. Everything else it sees goes to
the same file as an event line starting with "@" and the wall-clock time (time.time(): the
processes share the machine's clock):

    @start T pid                    the process started
    @assign T topic:p topic:p ...   on_assign with these partitions (incremental when cooperative)
    @generation T N member-id       the consumer's group_metadata() inside that on_assign
    @revoke T ...  /  @lost T ...   on_revoke / on_lost with these partitions (close() revokes too)
    @commit T topic:p=offset ...    a commit that succeeded, with the offsets it committed
    @commit-failed T error          a commit that raised (logged, then the loop goes on)
    @crash T                        right before the process SIGKILLs itself
    @closed T                       after close() returned (SIGTERM asks for it)

The file is flushed after every poll and after every event, so a SIGKILL loses nothing the
member did before it (the data is in the page cache, which outlives the process).

Commit modes, as the consumer's docstring defines the delivery guarantees:
- `after` (at-least-once): process a poll's records, then commit their next offsets; partitions
  being revoked are committed again in on_revoke (Kafka's pattern; under the cooperative protocol
  the broker accepts it while nobody owns them yet).
- `before` (at-most-once): commit a poll's next offsets, then process the records.

`--crash-after-records N` makes the member SIGKILL itself at its mode's worst moment once it has
polled N records: `after` right after processing a poll and before committing it (so those
records are redelivered), `before` right after committing a poll and before processing it (so
those records are lost).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from common.topic_partition import TopicPartition


# -- the member ------------------------------------------------------------------------------------


class Member:
    """The application loop of one member process; owns its consumer and its output file."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: IO[str] = open(args.out, "a", buffering=1 << 16)
        self.stopping = False
        self.polled = 0  # records returned by poll so far
        self.processed: dict[TopicPartition, int] = {}  # next offset after the last processed record
        self.consumer: Any = None

    def event(self, name: str, *fields: str) -> None:
        self.out.write(" ".join([f"@{name}", f"{time.time():.6f}", *fields]) + "\n")
        self.out.flush()

    def run(self) -> None:
        from client import Consumer

        self.event("start", str(os.getpid()))
        args = self.args
        settings: dict[str, Any] = {
            "group_id": args.group, "auto_offset_reset": "earliest", "enable_auto_commit": False,
            "session_timeout_ms": args.session_timeout_ms, "heartbeat_interval_ms": args.heartbeat_interval_ms,
            "partition_assignment_strategy": [args.strategy],
        }
        if args.instance_id:
            settings["group_instance_id"] = args.instance_id
        self.consumer = Consumer(args.bootstrap, **settings)
        try:
            self.consumer.subscribe([args.topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
                                    on_lost=self.on_lost)
            while not self.stopping:
                self.poll_once()
        finally:
            self.consumer.close()
            self.event("closed")
            self.out.close()

    def poll_once(self) -> None:
        records = self.consumer.poll(timeout_ms=200, max_records=self.args.max_records)
        if not records:
            return
        self.polled += len(records)
        offsets = _next_offsets(records)
        crash = self.args.crash_after_records is not None and self.polled >= self.args.crash_after_records
        if self.args.commit == "before":
            self.commit(offsets)
            if crash:
                self.crash()
            self.process(records)
        else:
            self.process(records)
            if crash:
                self.crash()
            self.commit(offsets)
        if self.args.poll_delay_ms:
            time.sleep(self.args.poll_delay_ms / 1000)  # not a wait: the member's "processing" time

    def process(self, records: list[Any]) -> None:
        self.out.write("".join(f"{r.topic} {r.partition} {r.offset}\n" for r in records))
        self.out.flush()
        self.processed.update(_next_offsets(records))

    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not offsets:
            return
        try:
            self.consumer.commit(offsets)
        except Exception as err:  # noqa: BLE001 - a failed commit is an outcome the tests read
            self.event("commit-failed", f"{type(err).__name__}:{str(err).replace(chr(10), ' ')}")
            return
        self.event("commit", *(f"{t}:{p}={o}" for (t, p), o in sorted(offsets.items())))

    def crash(self) -> None:
        self.event("crash")
        os.kill(os.getpid(), signal.SIGKILL)

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        self.event("assign", *_names(partitions))
        metadata = self.consumer.group_metadata()
        self.event("generation", str(metadata.generation_id), metadata.member_id)

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        self.event("revoke", *_names(partitions))
        if self.args.commit == "after":  # Kafka's pattern: commit what was processed before giving it up
            self.commit({tp: self.processed[tp] for tp in partitions if tp in self.processed})

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        self.event("lost", *_names(partitions))

    def stop(self, *_: Any) -> None:
        self.stopping = True


def _next_offsets(records: list[Any]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for r in records:
        out[(r.topic, r.partition)] = r.offset + 1
    return out


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{t}:{p}" for t, p in sorted(partitions)]


# -- the producer ----------------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> None:
    """Send `records` small values (their index as text; null keys, so the sticky partitioner
    spreads them, or partition i % `partitions`) at about `rate` records/s, then flush; exits
    non-zero if any failed."""
    from client import Producer

    failed: list[BaseException] = []

    def delivered(_metadata: Any, err: BaseException | None) -> None:
        if err is not None:
            failed.append(err)

    started = time.monotonic()
    with Producer(args.bootstrap, linger_ms=5) as producer:
        for i in range(args.records):
            partition = i % args.partitions if args.partitions else None
            producer.send(args.topic, b"%d" % (args.first + i), partition=partition, on_delivery=delivered)
            if args.rate and i % 1000 == 999:
                ahead_s = (i + 1) / args.rate - (time.monotonic() - started)
                if ahead_s > 0:
                    time.sleep(ahead_s)  # pacing, not a wait: produce at args.rate
        producer.flush()
    if failed:
        sys.exit(f"{len(failed)} records failed, first: {failed[0]!r}")


# -- reading a member's log ------------------------------------------------------------------------


@dataclass
class Event:
    name: str
    time: float
    fields: list[str]

    @property
    def partitions(self) -> set[TopicPartition]:
        """The partitions of an assign/revoke/lost event."""
        return {_parse_tp(f) for f in self.fields}

    @property
    def offsets(self) -> dict[TopicPartition, int]:
        """The offsets of a commit event."""
        out = {}
        for f in self.fields:
            tp, _, offset = f.partition("=")
            out[_parse_tp(tp)] = int(offset)
        return out


@dataclass
class MemberLog:
    """One member's output file, parsed. `records` are (topic, partition, offset, line number);
    `events` keep their line numbers too, so records and events can be put in order."""

    path: Path
    records: list[tuple[str, int, int, int]] = field(default_factory=list)
    events: list[tuple[int, Event]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> "MemberLog":
        log = cls(Path(path))
        if not log.path.exists():
            return log
        text = log.path.read_text()
        # A member may be writing while we read: leave out a last line it has not finished.
        for number, line in enumerate(text[:text.rfind("\n") + 1].splitlines()):
            if line.startswith("@"):
                name, stamp, *fields = line[1:].split(" ")
                log.events.append((number, Event(name, float(stamp), fields)))
            elif line:
                topic, partition, offset = line.split(" ")
                log.records.append((topic, int(partition), int(offset), number))
        return log

    def named(self, *names: str) -> list[Event]:
        return [e for _, e in self.events if e.name in names]

    def owned(self) -> set[TopicPartition]:
        """The partitions the member owns after the last event (assigns minus revokes and losses;
        eager protocols revoke everything before assigning the new set, so this fits both)."""
        owned: set[TopicPartition] = set()
        for event in self.named("assign", "revoke", "lost"):
            owned = owned | event.partitions if event.name == "assign" else owned - event.partitions
        return owned

    def generations(self) -> list[int]:
        return [int(e.fields[0]) for e in self.named("generation")]

    def last_commit(self) -> dict[TopicPartition, int]:
        """Per partition, the offset of the member's last successful commit of it."""
        out: dict[TopicPartition, int] = {}
        for event in self.named("commit"):
            out.update(event.offsets)
        return out

    def ownership_runs(self) -> list[list[tuple[TopicPartition, int]]]:
        """The processed offsets split at every assignment change, as (tp, offset) lists: within
        one run every partition's offsets must increase (Kafka's per-partition order)."""
        changes = {n for n, e in self.events if e.name in ("assign", "revoke", "lost", "start")}
        runs: list[list[tuple[TopicPartition, int]]] = [[]]
        items = sorted([(n, None) for n in changes] + [(n, (t, p, o)) for t, p, o, n in self.records],
                       key=lambda item: item[0])
        for _, rec in items:
            if rec is None:
                runs.append([])
            else:
                runs[-1].append(((rec[0], rec[1]), rec[2]))
        return [run for run in runs if run]

    def processed(self) -> dict[TopicPartition, list[int]]:
        out: dict[TopicPartition, list[int]] = defaultdict(list)
        for topic, partition, offset, _ in self.records:
            out[(topic, partition)].append(offset)
        return out


def _parse_tp(text: str) -> TopicPartition:
    topic, _, partition = text.rpartition(":")
    return topic, int(partition)


# -- command line ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.broker.group_member")
    commands = parser.add_subparsers(dest="command", required=True)
    consume = commands.add_parser("consume")
    consume.add_argument("--bootstrap", required=True)
    consume.add_argument("--group", required=True)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--out", required=True)
    consume.add_argument("--strategy", default="range")
    consume.add_argument("--instance-id", default=None)
    consume.add_argument("--session-timeout-ms", type=int, default=3000)
    consume.add_argument("--heartbeat-interval-ms", type=int, default=300)
    consume.add_argument("--commit", choices=["after", "before"], default="after")
    consume.add_argument("--max-records", type=int, default=500)
    consume.add_argument("--poll-delay-ms", type=int, default=0)
    consume.add_argument("--crash-after-records", type=int, default=None)
    producer = commands.add_parser("produce")
    producer.add_argument("--bootstrap", required=True)
    producer.add_argument("--topic", required=True)
    producer.add_argument("--records", type=int, required=True)
    producer.add_argument("--first", type=int, default=0, help="value of the first record")
    producer.add_argument("--partitions", type=int, default=0, help="send record i to partition i %% N (0: sticky)")
    producer.add_argument("--rate", type=float, default=0, help="records/s (0: as fast as possible)")
    args = parser.parse_args(argv)
    if args.command == "produce":
        produce(args)
        return
    member = Member(args)
    signal.signal(signal.SIGTERM, member.stop)
    member.run()


if __name__ == "__main__":
    main()
