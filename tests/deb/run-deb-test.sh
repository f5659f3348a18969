#!/usr/bin/env bash
# make deb-test: installs the packages `make deb` built (build/deb/*.deb) into
# a fresh Debian bookworm root made here with mmdebstrap, and runs in-root.sh
# there (see that file for what is checked). Nothing is installed on this
# machine except mmdebstrap itself; the root is deleted at the end.
#
# Cache (build/deb-root/): the minbase root tarball, remade when the apt
# sources or this recipe change (apt-get update runs inside it on every use,
# so an old tarball only means more upgrades), and the .debs apt downloaded
# inside the root (apt checks each against the archive's index, so a stale one
# is downloaded again). DEB_TEST_FRESH=1 ignores both.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
debdir=build/deb
cache=$repo/build/deb-root
recipe="mmdebstrap --variant=minbase bookworm v1"

shopt -s nullglob
debs=()
for f in "$debdir"/*.deb; do [[ $f == *-dbgsym_* ]] || debs+=("$f"); done
[ ${#debs[@]} -gt 0 ] || { echo "deb-test: no packages in $debdir (run make deb)"; exit 1; }

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! command -v mmdebstrap >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then exec $SUDO -E bash "$0" "$@"; fi

# The root uses this machine's own apt sources for bookworm (no mirror is
# written down here), in either sources format.
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -s "$f" ] && grep -Eq '^[^#]*\bbookworm\b' "$f" && sources+=("$f")
done
[ ${#sources[@]} -gt 0 ] || { echo "deb-test: no apt source for bookworm in /etc/apt"; exit 1; }

mkdir -p "$cache/archives/partial"
[ "${DEB_TEST_FRESH:-0}" != 1 ] || rm -rf "$cache/root.tar" "$cache/archives"/*.deb
key=$( { echo "$recipe"; cat "${sources[@]}"; } | sha256sum | cut -d' ' -f1)
t0=$(date +%s)
if [ -f "$cache/root.tar" ] && [ "$(cat "$cache/root.key" 2>/dev/null)" = "$key" ]; then
  echo "deb-test: cached root tarball $cache/root.tar"
else
  echo "deb-test: making a minbase bookworm root tarball (mmdebstrap, sources: ${sources[*]})"
  rm -f "$cache/root.tar" "$cache/root.key"
  mmdebstrap --quiet --variant=minbase --format=tar bookworm "$cache/root.tar.tmp" "${sources[@]}"
  mv "$cache/root.tar.tmp" "$cache/root.tar"
  echo "$key" >"$cache/root.key"
  echo "deb-test: root tarball made in $(( $(date +%s) - t0 ))s"
fi

root=$(mktemp -d /tmp/tz-deb-root.XXXXXX)
cleanup() {
  # The mounts lived in the unshared namespace only; never delete through one.
  if grep -q " $root" /proc/self/mounts; then echo "deb-test: $root still has mounts; not deleted"; return; fi
  echo "deb-test: deleting $root"
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -C "$root" -xf "$cache/root.tar"
mkdir -p "$root/debs" "$root/test" "$root/examples"
cp "${debs[@]}" "$root/debs/"
cp -r tests/vectors "$root/vectors"
cp -r examples/. "$root/examples/"
cp tests/deb/in-root.sh tests/deb/in_root_check.py "$root/test/"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# No service may start inside the root.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"; chmod 755 "$root/usr/sbin/policy-rc.d"

echo "deb-test: root $root; installing ${#debs[@]} packages: ${debs[*]##*/}"
t1=$(date +%s)
# A private mount namespace: /proc, /dev and the archive cache are mounted
# for the chroot only, and vanish with it whatever happens.
rc=0
unshare --mount --propagation private -- bash -euo pipefail -c '
  root=$1 cache=$2
  mount -t proc proc "$root/proc"
  mount --rbind /dev "$root/dev"
  mount -t sysfs sysfs "$root/sys"
  mount --bind "$cache/archives" "$root/var/cache/apt/archives"
  exec chroot "$root" /bin/bash /test/in-root.sh
' deb-test "$root" "$cache" || rc=$?
echo "deb-test: in-root test took $(( $(date +%s) - t1 ))s, exit $rc"
[ $rc -eq 0 ] && echo "deb-test: OK" || echo "deb-test: FAILED"
exit $rc
