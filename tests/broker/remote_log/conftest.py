"""Tiering is tested over real partition logs: the log tests' fixtures (batches, clock, logs)."""
from tests.broker.log.conftest import batch, clock, crash_log, logs, open_log, small_config, unified_log  # noqa: F401
