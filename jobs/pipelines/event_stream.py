"""A pipeline run's event stream as `spark-pipelines` reads it, with pyspark 4.2.0's defect
SPARK-59135 worked around.

The CLI reads the run's events through `SparkConnectClient.execute_command_as_iterator`, which in
4.2.0 ends with UNKNOWN_RESPONSE on anything that is not a result dict. Python data source
workers (every `format("pymq")` read) report empty profiler accumulators, which reach the client
as observed metrics (`__python_accumulator__`) mixed into the stream: the run completes, then the
CLI fails and exits 1. Upstream's fix makes the iterator pass metrics on and the pipeline's
consumer skip them; here the pipeline session's client skips them (the client has already applied
the accumulator updates before yielding them). Nothing changes on other pyspark versions: the
next upgrade drops this module if its fix is in, or the pipeline test says it is not.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyspark
from pyspark.errors import PySparkValueError
from pyspark.sql import SparkSession
from pyspark.sql.connect.client.core import PlanObservedMetrics
from pyspark.sql.metrics import PlanMetrics

DEFECTIVE_VERSIONS = {"4.2.0"}


def tolerate_metrics(spark: SparkSession) -> None:
    """Make `spark`'s Spark Connect client yield a command's results without its metrics."""
    if pyspark.__version__ not in DEFECTIVE_VERSIONS:
        return
    client = spark.client  # type: ignore[attr-defined]  # a Spark Connect session's

    def execute_command_as_iterator(command: Any, observations: dict | None = None) -> Iterator[dict[str, Any]]:
        # 4.2.0's method, with metrics skipped rather than raised on.
        request = client._execute_plan_request_with_metadata()
        if client._user_id:
            request.user_context.user_id = client._user_id
        client._set_command_in_plan(request.plan, command)
        for response in client._execute_and_fetch_as_iterator(request, observations or {}):
            if isinstance(response, dict):
                yield response
            elif not isinstance(response, (PlanMetrics, PlanObservedMetrics)):
                raise PySparkValueError(errorClass="UNKNOWN_RESPONSE", messageParameters={"response": str(response)})

    client.execute_command_as_iterator = execute_command_as_iterator
