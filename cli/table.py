"""`pymq table sync|status` and `pymq job ...`: the Spark jobs over topics (jobs/).

Their commands live in the job modules and are imported on demand (LazyGroup): they start Spark
with Delta Lake, which the other commands never need.
"""
from __future__ import annotations

from cli.common import LazyGroup

table_group = LazyGroup(
    "table", lazy_commands={"sync": "jobs.topic_table:sync_command", "status": "jobs.table_status:status_command"},
    help="Table topics: mirror a topic into a Delta Lake table, exactly once (sync), and see how far it caught up "
         "(status). Notebooks read both with pymq.history().")

job_group = LazyGroup(
    "job", lazy_commands={"retention": "jobs.retention:retention_command", "compact": "jobs.compact:compact_command"},
    help="Spark batch jobs over a topic's history: compaction of its tiered segments (compact) and its topic's "
         "retention applied to its table (retention).")
