#!/usr/bin/env bash
# Builds the local sandbox image roche/python:local from Debian packages, for machines that
# cannot reach a container registry, with roche image build python (internal/imagebuild:
# the one recipe, which users without a clone run too). Idempotent: does nothing when the
# image already exists from the recipe's version (the label roche.image.version); an older
# image is rebuilt under a temporary tag and then retagged, so that sandboxes starting
# meanwhile always find a whole image. The downloaded packages are kept in
# ~/.cache/roche/debootstrap for the next build.
#
#   scripts/build-test-image.sh [IMAGE]        (default roche/python:local)
set -euo pipefail
cd "$(dirname "$0")/.."

image=${1:-roche/python:local}
suite=${ROCHE_IMAGE_SUITE:-bookworm}

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

make -s build
exec bin/roche image build python --provider docker --tag "$image" --suite "$suite"
