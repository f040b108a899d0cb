"""The driver JVM's class-data-sharing archive (spark_datasource/class_archive.py): used when it
exists, no option at all when it does not, and an archive the JVM cannot use costs a warning on
stderr, never the start and never a line on the driver's stdout."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from spark_datasource.class_archive import archive_path, java_options


def test_a_missing_archive_is_no_option(tmp_path: Path) -> None:
    assert java_options(tmp_path / "none.jsa") == ""


def test_an_existing_archive_is_shared_and_its_warnings_go_to_stderr(tmp_path: Path) -> None:
    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"\0")
    options = shlex.split(java_options(archive))
    assert f"-XX:SharedArchiveFile={archive}" in options
    assert options[options.index("-Xlog:cds*=warning:stderr") - 1] == "-Xlog:cds*=off"


def test_the_archive_is_named_by_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYMQ_SPARK_CDS", str(tmp_path / "elsewhere.jsa"))
    assert archive_path() == tmp_path / "elsewhere.jsa"


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_a_jvm_given_an_archive_it_cannot_use_starts_and_says_so_on_stderr(tmp_path: Path) -> None:
    """Another JDK's archive, or a file that is none: the JVM runs without it (-Xshare:auto)."""
    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"not a CDS archive" * 64)
    done = subprocess.run(["java", *shlex.split(java_options(archive)), "-version"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # `java -version` itself prints to stderr; nothing of CDS on stdout
    assert "version" in done.stderr


def test_spark_daemons_and_spark_submit_map_the_archive_after_their_own_options(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Master, the Worker (SPARK_DAEMON_JAVA_OPTS), and spark-submit's driver and executors
    get the archive, with pyspark's own conf folder first on their classpath: the classpath the
    archive was made with, so that it fits them."""
    from spark_datasource.spark_daemons import SPARK_HOME, spark_env, submit_args

    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"\0")
    monkeypatch.setenv("PYMQ_SPARK_CDS", str(archive))
    env = spark_env()
    assert env["SPARK_CONF_DIR"] == str(SPARK_HOME / "conf")
    assert f"-XX:SharedArchiveFile={archive}" in shlex.split(env["SPARK_DAEMON_JAVA_OPTS"])
    settings = dict(arg.split("=", 1) for arg in submit_args("local[2]", {"spark.driver.extraJavaOptions": "-Dmine=1"})
                    if arg.startswith("spark.") and "JavaOptions" in arg)
    assert shlex.split(settings["spark.driver.extraJavaOptions"])[0] == "-Dmine=1"
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert f"-XX:SharedArchiveFile={archive}" in shlex.split(settings[key])
