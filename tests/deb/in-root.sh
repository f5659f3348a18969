#!/bin/bash
# Runs inside the fresh bookworm root (chroot) that run-deb-test.sh made:
# installs the built packages with apt, uses each one as a user would, then
# purges them and checks that nothing they installed is left.
# /debs: the .debs; /vectors: tests/vectors; /examples: examples/.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8
step() { echo; echo "=== $*"; }
ours=$(for f in /debs/*.deb; do dpkg-deb -f "$f" Package; done | sort)
have() { grep -qx "$1" <<<"$ours"; }

step "apt-get update; compilers and build tools (not ours)"
apt-get update -qq
apt-get install -y -qq --no-install-recommends gcc libc6-dev pkg-config cmake make g++ >/dev/null
echo "installed: gcc pkg-config cmake make g++"

step "apt-get install /debs/*.deb (dependencies from the Debian archive)"
before=$(dpkg-query -W -f '${Package}\n' | sort)
apt-get install -y -q --no-install-recommends /debs/*.deb 2>&1 | grep -E "^(Setting up (lib)?(python3-)?tensorizer|Setting up tensorizer|[0-9]+ upgraded)" || true
after=$(dpkg-query -W -f '${Package}\n' | sort)
echo "packages pulled in as dependencies: $(comm -13 <(echo "$before") <(echo "$after") | grep -cvxF -f <(echo "$ours"))"
for p in $ours; do dpkg-query -W -f '  ${Package} ${Version} ${Status}\n' "$p"; done

step "tzinspect.c with pkg-config --cflags --libs tensorizer"
echo "pkg-config: $(pkg-config --cflags --libs tensorizer)"
cc -std=c99 -Wall -Werror /examples/c/tzinspect.c $(pkg-config --cflags --libs tensorizer) -o /tmp/tzinspect
/tmp/tzinspect /vectors/structured.tensors --verify
echo "linked: $(ldd /tmp/tzinspect | grep libtensorizer)"

step "tzinspect through the CMake package (find_package(tensorizer))"
cmake -S /examples/cmake-consumer -B /tmp/cmake-consumer >/dev/null
cmake --build /tmp/cmake-consumer >/dev/null
/tmp/cmake-consumer/tzinspect /vectors/module.tensors --verify --quiet

step "tensorizer info / verify (tensorizer-tools)"
ls -l /usr/bin/tensorizer /usr/share/man/man1/tensorizer.1.gz
tensorizer --version
tensorizer info /vectors/structured.tensors
tensorizer verify /vectors/structured.tensors --quiet
key=$(python3 -c 'import json; print(json.load(open("/vectors/manifest.json"))["enc_random"]["key_hex"])')
echo "$key" > /tmp/enc_random.key
tensorizer info /vectors/enc_random.tensors --keyfile /tmp/enc_random.key
tensorizer verify /vectors/enc_random.tensors --keyfile /tmp/enc_random.key --quiet
TZ_PW=$(python3 -c 'import json; print(json.load(open("/vectors/manifest.json"))["enc_password"]["password"])') \
  tensorizer verify /vectors/enc_password.tensors --password-env TZ_PW --json
echo
rc=0; tensorizer verify /vectors/enc_random.tensors --quiet 2>/tmp/nokey.err || rc=$?
echo "verify of the encrypted vector without its key: exit $rc: $(cat /tmp/nokey.err)"
[ "$rc" -eq 1 ]

written=()
if have libtensorizer-torch-dev; then
  step "tz-torch example (examples/cpp) against libtensorizer-torch-dev and libtorch-dev"
  cmake -S /examples/cpp -B /tmp/cpp-example >/dev/null
  cmake --build /tmp/cpp-example >/dev/null
  echo "linked: $(ldd /tmp/cpp-example/save_reload_module | grep -E 'libtensorizer|libtorch\.')"
  /tmp/cpp-example/save_reload_module /tmp/net.tensors
  tensorizer verify /tmp/net.tensors --quiet
  written+=(/tmp/net.tensors)
fi

step "import tensorizer with the distro python3 (python3-tensorizer) and load every vector"
python3 /test/in_root_check.py "${written[@]}"

step "purge the packages; nothing they installed may be left"
files=$(dpkg -L $ours | sort -u)
apt-get purge -y -q $ours 2>&1 | grep -E "^(Removing|Purging) .*tensorizer" || true
left=0
for p in $ours; do
  if dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -qv "not-installed"; then
    echo "still known to dpkg: $p ($(dpkg-query -W -f '${Status}' "$p"))"; left=1
  fi
done
while IFS= read -r f; do
  [ -n "$f" ] && [ "$f" != "/." ] || continue
  if [ -d "$f" ] && [ ! -L "$f" ]; then
    # A directory may stay only while it holds others' files or another package owns it.
    if [ -z "$(ls -A "$f")" ] && ! dpkg -S "$f" >/dev/null 2>&1; then echo "left behind: empty directory $f"; left=1; fi
  elif [ -e "$f" ] || [ -L "$f" ]; then
    echo "left behind: $f"; left=1
  fi
done <<<"$files"
for d in /usr/lib/python3/dist-packages/tensorizer /usr/lib/python3/dist-packages/tensorizer_native-*; do
  [ ! -e "$d" ] || { echo "left behind: $d"; left=1; }
done
[ "$left" -eq 0 ]
echo "$(wc -l <<<"$files") paths from dpkg -L: none left"

step "in-root test: OK"
