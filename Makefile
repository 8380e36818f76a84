# The two commands a user needs: `make demo` and `make test`. Both run `make setup` first, which
# installs whatever is missing on a fresh Debian machine (Java 17, Debian's zookeeper, the .venv)
# and generates the Python code from protos/. Shipping: `make dist` (sdist and wheel), `make image`,
# `make image-test` (the wheel in a clean venv and the image, each run for real; README "Install").
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PROTOS := $(shell find protos -name '*.proto')
# protos/scrutiny/x/y.proto -> scrutiny/x/y_pb2.py (and _pb2.pyi, _pb2_grpc.py): every proto, none listed by hand
GENERATED := $(patsubst protos/%.proto,%_pb2.py,$(PROTOS))
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= scrutiny:$(VERSION)
# The base an operator with registry access gets; image-test makes its own from Debian's archive.
BASE_IMAGE ?= debian:bookworm-slim
TEST_BASE_IMAGE := scrutiny-build/debian:bookworm-minbase
WHEELHOUSE := dist/wheelhouse
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
# Most of a test's time is waiting (a run's delayed re-check, a session's expiry, a process's start): the
# tests run on this many workers, each with its own ZooKeeper, etcd and SparkSession.
TEST_WORKERS ?= 3

.PHONY: setup system-deps proto peers test test-real lint demo bench soak clean dist wheelhouse image image-test

setup: system-deps $(VENV)/.installed proto peers

# apt only when something is absent, so `make setup` stays quick and idempotent.
system-deps:
	@missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	[ -f /usr/share/java/zookeeper.jar ] || missing="$$missing zookeeper"; \
	{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	[ -f /usr/include/rocksdb/c.h ] || missing="$$missing librocksdb-dev"; \
	command -v ldb >/dev/null 2>&1 || missing="$$missing rocksdb-tools"; \
	[ -x /usr/bin/etcd ] || missing="$$missing etcd-server"; \
	command -v etcdctl >/dev/null 2>&1 || missing="$$missing etcd-client"; \
	command -v setpriv >/dev/null 2>&1 || missing="$$missing util-linux"; \
	command -v git >/dev/null 2>&1 || missing="$$missing git"; \
	command -v javac >/dev/null 2>&1 || missing="$$missing openjdk-17-jdk-headless"; \
	command -v mvn >/dev/null 2>&1 || missing="$$missing maven"; \
	if [ -n "$$missing" ]; then \
	  echo "installing with apt:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Real BookKeeper and Pulsar releases for the tests (tests/peers/versions names them), from Maven Central only
# (tests/peers/settings.xml): each release's jars, and the tests' client (tests/peers/src) built against BookKeeper's,
# in .peers/; nothing when present.
PEERS := .peers
BOOKKEEPER_LINES := $(shell awk '$$1 == "bookkeeper" {print $$2}' tests/peers/versions)
PULSAR_LINES := $(shell awk '$$1 == "pulsar" {print $$2}' tests/peers/versions)
MVN_PEERS := mvn -q -B -Dstyle.color=never -s tests/peers/settings.xml

# (each .fetched named here: a file only a pattern rule's chain names is intermediate, and make deletes it)
peers: $(BOOKKEEPER_LINES:%=$(PEERS)/bookkeeper-%/.fetched) $(PULSAR_LINES:%=$(PEERS)/pulsar-%/.fetched) \
  $(PULSAR_LINES:%=$(PEERS)/pulsar-%/.compiled)

$(PEERS)/bookkeeper-%/.fetched: tests/peers/pom.xml tests/peers/versions $(wildcard tests/peers/src/scrutiny/peers/*.java)
	rm -rf $(PEERS)/bookkeeper-$*
	$(MVN_PEERS) -f tests/peers/pom.xml dependency:copy-dependencies -Dbookkeeper.version=$* -DincludeScope=runtime \
	  -DoutputDirectory=$(CURDIR)/$(PEERS)/bookkeeper-$*/lib
	javac -nowarn -d $(PEERS)/bookkeeper-$*/classes -cp '$(PEERS)/bookkeeper-$*/lib/*' tests/peers/src/scrutiny/peers/*.java
	touch $@

# A Pulsar release's broker and everything it runs with (about 240 MB a release)
$(PEERS)/pulsar-%/.fetched: tests/peers/pulsar/pom.xml tests/peers/versions
	rm -rf $(PEERS)/pulsar-$*
	$(MVN_PEERS) -f tests/peers/pulsar/pom.xml dependency:copy-dependencies -Dpulsar.version=$* -DincludeScope=runtime \
	  -DoutputDirectory=$(CURDIR)/$(PEERS)/pulsar-$*/lib
	touch $@

# The tests' tools on Pulsar's own client (transactions: the Python client has none), built against the release
$(PEERS)/pulsar-%/.compiled: $(PEERS)/pulsar-%/.fetched $(wildcard tests/peers/pulsar/src/scrutiny/peers/*.java)
	rm -rf $(PEERS)/pulsar-$*/classes
	javac -nowarn -d $(PEERS)/pulsar-$*/classes -cp '$(PEERS)/pulsar-$*/lib/*' tests/peers/pulsar/src/scrutiny/peers/*.java
	touch $@

# Generated code is not committed: protos/ is the one source. build_support/protogen.py is the one
# generation step (the build backend runs it too: wheel, sdist, image), with the pinned grpcio-tools.
proto: $(GENERATED)
$(GENERATED) &: $(PROTOS) build_support/protogen.py $(VENV)/.installed
	$(PY) build_support/protogen.py >/dev/null

lint: setup
	$(VENV)/bin/ruff check scrutiny tests bench
	$(VENV)/bin/mypy

test: setup lint
	$(VENV)/bin/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Against real BookKeeper processes (tests/real/: bookies, AutoRecovery, the shell, the client, of every release
# tests/peers/versions names). CI runs it beside the soaks and the image test. Its tests mostly wait (on a broker's
# timers, a churn's minimum, a delayed look): three workers overlap those waits (idle: 544 s against 682 s with two).
# Four were faster idle (38 tests in 709 s, against 36 in 740 s with three), but on a loaded machine a continuous
# detection then took 37 s of its 20 (tests/real/test_losses.py).
REAL_WORKERS ?= 3
test-real: setup
	$(VENV)/bin/pytest -n $(REAL_WORKERS) -m real tests/real $(PYTEST_ARGS)

# `make demo DEMO_ARGS=--real-bookkeeper`: the demo on real bookies (BookKeeper's own client writes the ledgers)
DEMO_ARGS ?=
demo: setup
	$(VENV)/bin/scrutiny demo $(DEMO_ARGS)

bench: setup
	$(PY) -m bench.run

# The soaks (README: "Churn soak"): the tests marked soak (the churn soaks on ZooKeeper and etcd, the
# auditor's threads and descriptors over many runs, continuous scrutiny's bench on a small cluster), then
# the long churn soak, SOAK_SECONDS long. CI runs it after make test, with a shorter long soak.
SOAK_SECONDS ?= 600
SOAK_OUTPUT ?= bench/results/soak.json
soak: setup
	$(VENV)/bin/pytest -n $(TEST_WORKERS) -m soak $(PYTEST_ARGS)
	$(PY) -m scrutiny.testing.soak --seconds $(SOAK_SECONDS) --output $(SOAK_OUTPUT)

# The sdist and the wheel, built as any PEP 517 frontend builds them (isolated, the wheel from the sdist).
dist: setup
	rm -rf dist/scrutiny-*
	$(PY) -m build --outdir dist . >/dev/null
	@ls dist/scrutiny-*

# Every wheel the image needs, built here where the package index is reachable: the build installs offline.
wheelhouse: dist
	rm -rf $(WHEELHOUSE)
	$(PY) -m pip wheel -q -w $(WHEELHOUSE) dist/scrutiny-$(VERSION)-py3-none-any.whl

# Starts a Docker daemon when none answers, and leaves it running (`docker/dockerd.sh stop` stops it).
image: wheelhouse
	docker/dockerd.sh start
	docker build -q --network host --build-arg BASE=$(BASE_IMAGE) -f docker/Dockerfile -t $(IMAGE) .

# The wheel in a clean venv and the image, installed and run as an operator would (tests/install/). A Docker
# daemon it had to start is stopped at the end, passed or failed.
image-test: setup
	docker/dockerd.sh start
	status=0; { docker/base-image.sh $(TEST_BASE_IMAGE) \
	  && $(MAKE) image BASE_IMAGE=$(TEST_BASE_IMAGE) \
	  && docker image prune -f >/dev/null `# the replaced build (under vfs storage, GBs each)` \
	  && SCRUTINY_IMAGE=$(IMAGE) $(VENV)/bin/pytest -m install tests/install $(PYTEST_ARGS); } || status=$$?; \
	docker/dockerd.sh stop; exit $$status

clean:
	rm -rf $(VENV) $(PEERS) dist build $(GENERATED) $(GENERATED:.py=.pyi) $(GENERATED:.py=_grpc.py)
