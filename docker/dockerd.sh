#!/usr/bin/env bash
# docker/dockerd.sh start|stop
#
# start: a Docker engine that answers, for `make image` and `make image-test`. Where none runs and we are root on
# Debian (CI, a fresh machine of this project's kind, no systemd), install Debian's docker.io and start its
# daemon the way this kind of machine allows: overlay2 storage where the kernel mounts overlays, else vfs (which
# copies a whole root filesystem for every layer and container: the image test takes minutes longer), no
# iptables, no bridge (containers use --network host), and note its pid. An engine that already answers is left
# alone, and is never stopped here.
# stop: stop the daemon `start` started (nothing when it started none), and wait for it to end.
set -euo pipefail
pidfile=${DOCKERD_PIDFILE:-/run/scrutiny-dockerd.pid}

stop() {
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  rm -f "$pidfile"
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 60); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.5
  done
  echo "dockerd.sh: dockerd ($pid) did not stop within 30 s: killing it" >&2
  kill -9 "$pid" 2>/dev/null || true
}

start() {
  docker info >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "dockerd.sh: no Docker engine answers and this is not root: start Docker, then run again" >&2
    exit 1
  fi
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
  log=${DOCKERD_LOG:-/var/log/scrutiny-dockerd.log}
  local driver
  for driver in overlay2 vfs; do
    nohup dockerd --storage-driver="$driver" --iptables=false --bridge=none >"$log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 120); do
      if docker info >/dev/null 2>&1; then
        echo "dockerd.sh: dockerd started with $driver storage"
        return 0
      fi
      kill -0 "$(cat "$pidfile")" 2>/dev/null || break  # it refused the driver: try the next
      sleep 0.5
    done
    echo "dockerd.sh: dockerd with $driver storage did not answer; its log ($log):" >&2
    tail -n 5 "$log" >&2
    stop
  done
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: docker/dockerd.sh start|stop" >&2; exit 2 ;;
esac
