"""`python -m tests.broker.debug_tiering_broker broker start ...`: `python -m cli` with the
remote log manager's DEBUG lines in the broker's output. It logs a run of tiering failures once at
WARNING and the later failures of the run at DEBUG ("failed (N in a row; retry in D ms)"), which is
how tests/broker/test_tiering_outage.py sees the backoff grow. Broker code is unchanged."""
import logging

from cli import main

logging.getLogger("broker.remote_log.remote_log_manager").setLevel(logging.DEBUG)
main()
