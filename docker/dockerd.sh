#!/usr/bin/env bash
# A Docker engine that answers, for `make image` and `make image-test`. Where none runs and we are root
# on Debian (CI, a fresh machine of this project's kind, no systemd), install Debian's docker.io and start
# its daemon the way this kind of machine allows: vfs storage, no iptables, no bridge (containers use
# --network host). An engine that already answers is left alone.
set -euo pipefail
docker info >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "dockerd.sh: no Docker engine answers and this is not root: start Docker, then run again" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi
log=${DOCKERD_LOG:-/var/log/scrutiny-dockerd.log}
nohup dockerd --storage-driver=vfs --iptables=false --bridge=none >"$log" 2>&1 &
for _ in $(seq 120); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "dockerd.sh: dockerd did not answer within 60 s; its log: $log" >&2
tail -n 20 "$log" >&2
exit 1
