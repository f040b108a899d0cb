"""The JVM jars pymq's Spark jobs add to pyspark's: Delta Lake and hadoop-aws (for `s3a://`).

`conf/spark-jars.pom.xml` names them; `jars.main()` (run by `make venv`)
copies them with their runtime dependencies from Maven Central into `<venv>/spark-jars`, leaving
out every artifact that pyspark already ships (its Scala, Hadoop, Parquet, Jackson and log4j must
win, or Spark fails at class loading). `spark_conf()` then puts that folder's jars on
`spark.jars`. Without the folder (pymq installed without `make`), it falls back to
`spark.jars.packages` with the same coordinates, which Spark resolves through Ivy at start.

The folder lives in the venv because it belongs to the pyspark installed there: a venv built for
another pyspark pin gets its own jars.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pyspark

POM = Path(__file__).resolve().parent.parent / "conf" / "spark-jars.pom.xml"
_MAVEN_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# `name-1.2.3.jar` -> `name`: the artifact id is everything before the first "-<digit>".
_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-\d[^/]*\.jar$")
_COMPLETE = ".complete"


class SparkJarsError(RuntimeError):
    """The Delta Lake / hadoop-aws jars could not be installed (Maven missing or unreachable)."""


def jars_dir() -> Path:
    """Where the jars are: `PYMQ_SPARK_JARS`, or `spark-jars` in this interpreter's prefix (the venv)."""
    return Path(os.environ.get("PYMQ_SPARK_JARS") or Path(sys.prefix) / "spark-jars")


def installed_jars(folder: Path | None = None) -> list[Path] | None:
    """The jars of a completed install, or None when there is none."""
    folder = folder or jars_dir()
    if not (folder / _COMPLETE).exists():
        return None
    return sorted(folder.glob("*.jar"))


def spark_conf() -> dict[str, str]:
    """The session settings that put the jars on Spark's classpath."""
    jars = installed_jars()
    if jars:
        return {"spark.jars": ",".join(str(jar) for jar in jars)}
    return {"spark.jars.packages": ",".join(coordinates())}


def coordinates(pom: Path = POM) -> list[str]:
    """`group:artifact:version` of each direct dependency in the pom, its properties expanded."""
    root = ET.parse(pom).getroot()
    declared = root.find("m:properties", _MAVEN_NS)
    properties = {child.tag.split("}", 1)[1]: child.text or "" for child in (declared if declared is not None else ())}

    def expand(text: str) -> str:
        return re.sub(r"\$\{([^}]+)\}", lambda m: properties[m.group(1)], text)

    return [":".join(expand(dep.findtext(f"m:{part}", "", _MAVEN_NS)) for part in ("groupId", "artifactId", "version"))
            for dep in root.iterfind("m:dependencies/m:dependency", _MAVEN_NS)]


def shipped_artifacts() -> set[str]:
    """Artifact ids of the jars inside the installed pyspark."""
    return {artifact_of(jar.name) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")} - {None}


def artifact_of(file_name: str) -> str | None:
    match = _ARTIFACT.match(file_name)
    return match.group("artifact") if match else None


def install(target: Path | None = None, pom: Path = POM) -> list[Path]:
    """Copy the pom's runtime dependencies into `target`, minus pyspark's own artifacts. The folder
    appears whole or not at all: the copy goes to a temporary sibling that is renamed in place."""
    target = target or jars_dir()
    if installed_jars(target) and (target / _COMPLETE).read_text() == pom.read_text():
        return installed_jars(target) or []
    if shutil.which("mvn") is None:
        raise SparkJarsError("Maven (mvn) is needed to fetch the Delta Lake jars: install it (apt-get install maven)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".spark-jars-", dir=target.parent))
    try:
        result = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={staging}"], capture_output=True, text=True)
        if result.returncode != 0:
            raise SparkJarsError(f"mvn could not fetch the Spark jars of {pom}:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
        shipped = shipped_artifacts()
        for jar in staging.glob("*.jar"):
            if artifact_of(jar.name) in shipped:
                jar.unlink()
        (staging / _COMPLETE).write_text(pom.read_text())
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return installed_jars(target) or []


def main() -> None:
    jars = install()
    total = sum(jar.stat().st_size for jar in jars)
    print(f"{len(jars)} Spark jars ({total / 2**20:.0f} MiB) in {jars_dir()}")

