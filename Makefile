# The two commands a user needs: `make demo` and `make test`. Both run `make setup` first, which
# installs whatever is missing on a fresh Debian machine (Java 17, Debian's zookeeper, the .venv)
# and generates the Python code from protos/.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROTOS := $(shell find protos -name '*.proto')
GENERATED := scrutiny/v1/bookie_pb2.py scrutiny/v1/auditor_pb2.py scrutiny/bookkeeper/ledger_metadata_pb2.py \
	scrutiny/bookkeeper/dbledgerstorage_pb2.py scrutiny/pulsar/managed_ledger_pb2.py
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: setup system-deps proto test lint demo bench soak clean

setup: system-deps $(VENV)/.installed proto

# apt only when something is absent, so `make setup` stays quick and idempotent.
system-deps:
	@missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	[ -f /usr/share/java/zookeeper.jar ] || missing="$$missing zookeeper"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  echo "installing with apt:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Generated code is not committed: protos/ is the one source, and the generator is the one
# pinned in the venv, so the code always matches the installed protobuf runtime.
proto: $(GENERATED)
$(GENERATED) &: $(PROTOS) $(VENV)/.installed
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

lint: setup
	$(VENV)/bin/ruff check scrutiny tests bench
	$(VENV)/bin/mypy

test: setup lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/scrutiny demo

bench: setup
	$(PY) -m bench.run

# The long churn soak (README: "Churn soak"); SOAK_SECONDS to change its length.
SOAK_SECONDS ?= 600
soak: setup
	$(PY) -m scrutiny.testing.churn --seconds $(SOAK_SECONDS) --output bench/results/soak.json

clean:
	rm -rf $(VENV) $(GENERATED) $(GENERATED:.py=.pyi) scrutiny/v1/*_pb2*.py* scrutiny/bookkeeper/*_pb2*.py* scrutiny/pulsar/*_pb2*.py*
