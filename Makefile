# Everything a fresh machine needs: `make run` (the main job), `make test` (the suite) and
# `make test-fast` (the suite without Spark, clusters and slow tests).
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv run test test-fast bench clean

venv: $(STAMP)

# Python deps into the venv; then the Delta Lake and hadoop-aws jars from Maven Central into
# $(VENV)/spark-jars (spark_datasource/jars.py), with Maven from Debian's packages if missing;
# Debian's etcd-server (the metadata store of a cluster) if missing; the class archive that makes a
# local Spark JVM start faster (spark_datasource/archive_classes.py).
$(STAMP): pyproject.toml conf/spark-jars.pom.xml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]' --config-settings editable_mode=compat
	command -v mvn >/dev/null || (apt-get update -q && apt-get install -y -q maven)
	command -v etcd >/dev/null || (apt-get update -q && apt-get install -y -q etcd-server)
	$(BIN)/python -c 'from spark_datasource import jars; jars.main()'
	$(BIN)/python -c 'from spark_datasource import archive_classes; archive_classes.main()' \
		|| echo 'no Spark class archive: Spark JVMs start without it, slower'
	touch $(STAMP)

run: venv
	$(BIN)/python -m jobs.demo

# Python may write its bytecode caches (__pycache__, ignored by git) even where the environment
# says not to (PYTHONDONTWRITEBYTECODE): a run starts hundreds of Python processes (brokers, CLI
# commands, Spark's Python workers), and each one compiled the project's modules again (~0.15 CPU-s
# a process), and pytest rewrote every test module's asserts again in each worker.
#
# Three workers on two cores: much of the suite waits (failovers, session timeouts, backoffs,
# Spark's triggers), and with two workers the cores were partly idle: 9 min 52 s against
# 11 min 23 s for the same suite (2026-11-29), both cores busy throughout.
PYTEST_WORKERS ?= 3

test: venv
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

# The edit-run loop: no Spark JVM, no multi-broker cluster or etcd, nothing `slow` (the marks
# tests/conftest.py sets from the fixtures a test uses).
test-fast: venv
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "not spark and not cluster and not slow"

bench: venv
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info
