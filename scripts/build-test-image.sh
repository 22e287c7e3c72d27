#!/usr/bin/env bash
# Builds the local sandbox image roche/python:local from Debian packages, for machines that
# cannot reach a container registry. Idempotent: does nothing when the image already exists.
#
#   scripts/build-test-image.sh [IMAGE]        (default roche/python:local)
#
# debootstrap's minbase variant plus python3 gives the full standard library (python3-minimal
# alone lacks json), coreutils, tar and a POSIX sh: everything the test suite runs inside.
set -euo pipefail

image=${1:-roche/python:local}
suite=${ROCHE_IMAGE_SUITE:-bookworm}

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "image $image already exists"
  exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

root=$(mktemp -d /tmp/roche-image.XXXXXX)
trap 'rm -rf "$root"' EXIT

echo "debootstrapping $suite with python3 into $root (about a minute)"
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
debootstrap --variant=minbase --include=python3 "$suite" "$root" ${mirror:+"$mirror"} >/tmp/roche-debootstrap.log 2>&1 || {
  echo "debootstrap failed; see /tmp/roche-debootstrap.log" >&2
  tail -n 20 /tmp/roche-debootstrap.log >&2
  exit 1
}
# Trim what a sandbox never needs: package caches and docs.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man

echo "importing $root as $image"
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["python3"]' - "$image" >/dev/null
echo "built $image"
