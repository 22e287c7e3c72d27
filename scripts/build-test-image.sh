#!/usr/bin/env bash
# Builds the local sandbox image roche/python:local from Debian packages, for machines that
# cannot reach a container registry. Idempotent: does nothing when the image already exists
# and carries this script's contents version (the label roche.image.version); an older image
# (one without numpy, pandas and matplotlib) is rebuilt, under a temporary tag and then
# retagged, so that sandboxes starting meanwhile always find a whole image.
#
#   scripts/build-test-image.sh [IMAGE]        (default roche/python:local)
#
# debootstrap's minbase variant plus python3 gives the full standard library (python3-minimal
# alone lacks json), coreutils, tar and a POSIX sh: everything the test suite runs inside.
# numpy, pandas and matplotlib (Debian's builds) make the code contexts' rich results real:
# a chart as a PNG, a DataFrame as HTML.
set -euo pipefail

image=${1:-roche/python:local}
suite=${ROCHE_IMAGE_SUITE:-bookworm}
# Bump when the packages below change, so that existing images are rebuilt.
version=4
packages=python3,python3-numpy,python3-pandas,python3-matplotlib

have=$(docker image inspect "$image" --format '{{index .Config.Labels "roche.image.version"}}' 2>/dev/null || true)
if [ "$have" = "$version" ]; then
  echo "image $image already exists (version $version)"
  exit 0
fi
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "image $image is older (version '${have:-1}', want $version): rebuilding it"
fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

root=$(mktemp -d /tmp/roche-image.XXXXXX)
trap 'rm -rf "$root"' EXIT

echo "debootstrapping $suite with $packages into $root (a few minutes)"
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
debootstrap --variant=minbase --include="$packages" "$suite" "$root" ${mirror:+"$mirror"} >/tmp/roche-debootstrap.log 2>&1 || {
  echo "debootstrap failed; see /tmp/roche-debootstrap.log" >&2
  tail -n 20 /tmp/roche-debootstrap.log >&2
  exit 1
}
# Debian's python3-fonttools (matplotlib needs it) depends on scipy and sympy for features
# matplotlib never uses, and scipy's pythran on gcc, g++ and boost: 700 MB. They go again,
# with dpkg told to ignore the dependencies, and the imports are checked after.
unneeded="libboost1.74-dev python3-scipy python3-sympy python3-mpmath python3-pythran
  python3-gast python3-beniget gcc-12 g++-12 cpp-12 gcc g++ cpp libstdc++-12-dev libgcc-12-dev
  libopenblas-pthread-dev libopenblas-dev liblapack-dev libblas-dev libpython3.11-dev
  libpython3-dev python3.11-dev python3-dev libexpat1-dev zlib1g-dev libc6-dev libc-dev-bin
  linux-libc-dev libcrypt-dev libnsl-dev libtirpc-dev rpcsvc-proto binutils binutils-common
  binutils-x86-64-linux-gnu libbinutils libgprofng0 libctf0 libctf-nobfd0 libasan8 libtsan2
  liblsan0 libubsan1 libitm1 libcc1-0 libisl23 libmpc3 unicode-data"
# shellcheck disable=SC2086
installed=$(chroot "$root" dpkg-query -W -f '${Package}\n' $unneeded 2>/dev/null || true)
if [ -n "$installed" ]; then
  # shellcheck disable=SC2086
  chroot "$root" dpkg --purge --force-depends $installed >>/tmp/roche-debootstrap.log 2>&1
fi
# Debian's matplotlib ships a setuptools namespace-package .pth, which site runs at every
# Python start (importing importlib.util and more): 6-8 ms of every python3 -c in a
# sandbox. Python 3 finds mpl_toolkits as a namespace package without it.
rm -f "$root"/usr/lib/python3/dist-packages/*-nspkg.pth
chroot "$root" python3 -c 'import matplotlib.pyplot, numpy, pandas, mpl_toolkits.mplot3d' || {
  echo "numpy, pandas or matplotlib does not import in the image" >&2
  exit 1
}
# Trim what a sandbox never needs: package caches and docs.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man

# Python's bytecode caches, compiled now: a read-only sandbox cannot write them, and would
# otherwise compile pandas and matplotlib from source on every import.
chroot "$root" python3 -m compileall -q -j 0 /usr/lib/python3 >/dev/null 2>&1 || true

tmp="$image-build-$$"
echo "importing $root as $tmp"
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL roche.image.version=$version" \
  --change 'CMD ["python3"]' - "$tmp" >/dev/null
# docker tag moves the name in one step; the temporary name goes after.
docker tag "$tmp" "$image"
docker rmi "$tmp" >/dev/null
echo "built $image (version $version)"
