"""Coordinators: pure state machines whose state lives in internal compacted topics (docs/architecture.md, Coordinator).

`group_coordinator` runs consumer groups and committed offsets over `__consumer_offsets`
(`group_records`); the runtime that appends and replays their records is `broker.handlers.group`.
"""
