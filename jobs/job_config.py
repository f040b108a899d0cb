"""The jobs' defaults, from conf/jobs.toml (one table per job)."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

JOBS_TOML = Path(__file__).resolve().parent.parent / "conf" / "jobs.toml"


def job_defaults(job: str, path: Path = JOBS_TOML) -> dict[str, Any]:
    with path.open("rb") as file:
        return dict(tomllib.load(file).get(job, {}))
