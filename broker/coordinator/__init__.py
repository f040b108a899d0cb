"""Coordinators: pure state machines whose state lives in internal compacted topics (docs/architecture.md, Coordinator).

`group_coordinator` runs consumer groups and committed offsets over `__consumer_offsets`
(`group_records`); `runtime` hosts a state machine on its topic's partitions (load, replay,
unload on leadership changes, appends, timers), one `CoordinatorRuntime` per coordinator.
"""
