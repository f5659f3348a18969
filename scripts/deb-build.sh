#!/usr/bin/env bash
# make deb: builds the Debian packages (debian/) from the checkout into build/deb/
# and runs lintian on them. Installs the build tools and Build-Depends on this
# machine through apt when missing; builds from a copy of the checkout's files
# (tracked plus untracked-but-not-ignored), so nothing is written into the tree.
#   DEB_BUILD_PROFILES=pkg.tensorizer.notorch  skips libtensorizer-torch0/-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=build/deb
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
tools="dpkg-dev debhelper dh-python lintian fakeroot"
missing=()
for p in $tools; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Build-Depends not yet satisfied (dpkg-checkbuilddeps names them), for the profiles asked for.
profiles=${DEB_BUILD_PROFILES:-}
if ! unmet=$(dpkg-checkbuilddeps ${profiles:+-P"$profiles"} 2>&1); then
  echo "deb: installing Build-Depends: ${unmet#*Unmet build dependencies: }"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get build-dep -y -qq --no-install-recommends \
    ${profiles:+-P "$profiles"} ./ >/dev/null
fi

version=$(dpkg-parsechangelog -S Version)
src=$out/src/tensorizer-$version
rm -rf "$out"
mkdir -p "$src"
git ls-files -z --cached --others --exclude-standard \
  | xargs -0 -I{} sh -c '[ -e "{}" ] && printf "%s\0" "{}"' \
  | tar --null -T - -cf - | tar -xf - -C "$src"

echo "deb: dpkg-buildpackage in $src (log: $out/build.log)"
start=$(date +%s)
# The system's tools first: not a pyenv python3 or a pip cmake that PATH may prefer.
( cd "$src" && PATH=/usr/sbin:/usr/bin:/sbin:/bin:$PATH \
    DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" dpkg-buildpackage -us -uc -b ${profiles:+-P"$profiles"} ) >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; echo "deb: dpkg-buildpackage failed (log: $out/build.log)"; exit 1; }
mv "$out"/src/*.deb "$out"/src/*.changes "$out"/src/*.buildinfo "$out"/
echo "deb: built in $(( $(date +%s) - start ))s:"
( cd "$out" && ls -1 *.deb )
grep -A3 "dpkg-gensymbols" "$out/build.log" || true

# lintian: errors fail the build; warnings are listed (README.md, "Debian packages").
changes=$(ls "$out"/*.changes)
set +e
lintian --display-info --fail-on error "$changes" >"$out/lintian.txt" 2>&1
lrc=$?
set -e
echo "deb: lintian ($out/lintian.txt):"
cat "$out/lintian.txt"
[ $lrc -eq 0 ] || { echo "deb: lintian reported errors"; exit 1; }
echo "deb: OK"
