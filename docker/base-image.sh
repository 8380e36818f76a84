#!/usr/bin/env bash
# docker/base-image.sh NAME: a Debian bookworm base image made from Debian's archive alone
# (debootstrap --variant=minbase, then docker import), for machines that reach no image registry.
# Does nothing when NAME exists. The mirror is the one apt uses here (DEBIAN_MIRROR overrides it).
set -euo pipefail
name=${1:?usage: base-image.sh NAME:TAG}
docker image inspect "$name" >/dev/null 2>&1 && exit 0
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
root=$(mktemp -d /var/tmp/scrutiny-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
chmod 755 "$root"  # mktemp made it 0700: it becomes the image's /
debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "base image $name from $mirror"
