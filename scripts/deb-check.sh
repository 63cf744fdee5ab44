#!/bin/bash
# Builds the Debian packages and checks them without touching this machine's /usr:
#   1. dpkg-buildpackage -us -uc -b in a copy of the tree (build dirs and .git left out),
#      with DEB_BUILD_OPTIONS=nocheck: the suite is not run during the package build
#      (SPOOL_DEB_CHECK=1 runs debian/rules' quick subset: queue, cli, install); the build
#      log, with its compiler warnings listed, is kept next to the .debs; then lintian on
#      the .changes if lintian is installed (an error fails the check);
#   2. the .debs extracted with dpkg-deb -x into a temporary root: the tools run from there,
#      and the examples are built with `pkg-config --cflags --libs spool` against the
#      extracted libspool-dev and run with LD_LIBRARY_PATH pointing into it;
#   3. unless --no-chroot: installed with apt-get into a fresh minimal Debian 12 root
#      (debootstrap --variant=minbase, chroot; dependencies come from the Debian mirror),
#      where the tools, the man pages and an example built there against the installed
#      libspool-dev are run.
# Needs root (apt-get, chroot). Takes several minutes (a full release build of the library
# and tools, then downloads for the chroot), so it is not part of scripts/test.sh.
#
#   bash scripts/deb-check.sh [--no-chroot] [OUT_DIR]     .debs are left in OUT_DIR
#                                                         (default /tmp/spool-debs),
#                                                         with build.log
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
chroot_check=1
[ "${1:-}" = --no-chroot ] && { chroot_check=0; shift; }
OUT=${1:-/tmp/spool-debs}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo

# The packaging tools, then debian/control's Build-Depends (apt reads them from the tree).
for p in debhelper dpkg-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$p" >/dev/null
done
dpkg-checkbuilddeps >/dev/null 2>&1 ||
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get build-dep -y -qq --no-install-recommends "$SRC" >/dev/null

version=$(dpkg-parsechangelog -l debian/changelog -S Version)
WORK=$(mktemp -d /tmp/spool-deb-check.XXXXXX)
ROOT=""
cleanup() {
  if [ -n "$ROOT" ]; then
    for m in dev/pts dev proc sys; do $SUDO umount -l "$ROOT/$m" 2>/dev/null || true; done
  fi
  # --one-file-system: should an unmount above have failed, never descend into the host's
  # /dev, /proc or /sys through a bind mount left in the chroot.
  rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

echo "== 1. dpkg-buildpackage -us -uc -b (spool $version)"
mkdir -p "$WORK/src/spool-$version"
tar -C "$SRC" --exclude='./build*' --exclude=./.git --exclude='./obj-*' --exclude=./debian/tmp \
  -cf - . | tar -C "$WORK/src/spool-$version" -xf -
opts="nocheck parallel=$(nproc)"
[ "${SPOOL_DEB_CHECK:-0}" = 1 ] && opts="parallel=$(nproc)"
SECONDS=0
(cd "$WORK/src/spool-$version" && DEB_BUILD_OPTIONS=$opts dpkg-buildpackage -us -uc -b) \
  >"$WORK/build.log" 2>&1 || { tail -n 60 "$WORK/build.log"; exit 1; }
echo "   built in ${SECONDS}s"
mkdir -p "$OUT"
rm -f "$OUT"/*.deb
cp "$WORK"/src/*.deb "$WORK/build.log" "$OUT/"
echo "   compiler warnings in the package build ($OUT/build.log): $(grep -c 'warning:' "$WORK/build.log" || true)"
grep 'warning:' "$WORK/build.log" | sort -u | sed 's/^/     /' || true
ls -l "$OUT"
for d in "$OUT"/*.deb; do
  echo "-- $(basename "$d"): $(stat -c %s "$d") bytes, Installed-Size $(dpkg-deb -f "$d" Installed-Size) KiB"
  echo "   Depends: $(dpkg-deb -f "$d" Depends)"
  dpkg-deb -c "$d" | awk '{print "   " $6 ($7 ? " " $7 " " $8 : "")}' | grep -v '/$' || true
done
# lintian (if installed; `apt-get install lintian`): errors fail the check, warnings and
# the pedantic tags are only printed.
if command -v lintian >/dev/null; then
  echo "== lintian"
  lintian --fail-on error --info "$WORK"/src/spool_"${version}"_*.changes || {
    echo "lintian: errors (above)"; exit 1; }
  echo "   lintian: no errors"
fi
lib=$(ls "$OUT"/libspool0_*.deb); dev=$(ls "$OUT"/libspool-dev_*.deb); tools=$(ls "$OUT"/spool-tools_*.deb)

echo "== 2. extracted into a temporary root (dpkg-deb -x)"
X=$WORK/x
for d in "$lib" "$dev" "$tools"; do dpkg-deb -x "$d" "$X"; done
"$X/usr/bin/spool" --version
"$X/usr/bin/spool" --help >/dev/null
"$X/usr/bin/spoolfs" --help >/dev/null
"$X/usr/bin/spool-dump" --help 2>/dev/null || [ $? = 2 ]
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
export PKG_CONFIG_PATH=$X/usr/lib/$multiarch/pkgconfig PKG_CONFIG_SYSROOT_DIR=$X
flags=$(pkg-config --cflags --libs spool)
echo "   pkg-config --cflags --libs spool: $flags"
for ex in producer worker; do
  c++ -std=c++20 -Wall -Wextra -Werror "$X/usr/share/doc/libspool-dev/examples/$ex.cc" $flags -o "$WORK/$ex"
done
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
LD_LIBRARY_PATH=$X/usr/lib/$multiarch ldd "$WORK/worker" | grep libspool
LD_LIBRARY_PATH=$X/usr/lib/$multiarch "$WORK/producer" "$WORK/q" 300
LD_LIBRARY_PATH=$X/usr/lib/$multiarch "$WORK/worker" "$WORK/q" --idle-exit 1 --out "$WORK/done"
[ "$(sort -u "$WORK/done" | wc -l)" = 300 ] || { echo "worker processed $(wc -l <"$WORK/done") of 300"; exit 1; }
"$X/usr/bin/spool" stats "$WORK/q" --json
echo "   ok: tools run, examples built against libspool-dev, 300 messages processed"

[ $chroot_check = 1 ] || { echo "deb-check: ok (no chroot)"; exit 0; }

echo "== 3. apt-get install into a fresh Debian 12 root (chroot)"
BASE=${SPOOL_DEB_BASE:-/var/tmp/spool-deb-check-base.tar}
if [ ! -f "$BASE" ]; then
  # The fresh-machine tool's pristine minbase root, if this machine has one; else our own.
  if [ -f "${FRESH_MACHINE_DIR:-/tmp/fresh-machine}/pristine.tar" ]; then
    cp "${FRESH_MACHINE_DIR:-/tmp/fresh-machine}/pristine.tar" "$BASE"
  else
    command -v debootstrap >/dev/null || $SUDO apt-get install -y -qq debootstrap >/dev/null
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1)
    [ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    $SUDO debootstrap --variant=minbase bookworm "$WORK/base" "$mirror" >"$WORK/debootstrap.log" 2>&1 ||
      { tail -n 20 "$WORK/debootstrap.log"; exit 1; }
    $SUDO tar -C "$WORK/base" -cf "$BASE" .
    $SUDO rm -rf "$WORK/base"
  fi
fi
ROOT=$WORK/root
mkdir -p "$ROOT"
$SUDO tar -C "$ROOT" -xf "$BASE"
$SUDO cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
$SUDO mkdir -p "$ROOT/debs" "$ROOT/examples"
$SUDO cp "$lib" "$dev" "$tools" "$ROOT/debs/"
$SUDO mount --bind /dev "$ROOT/dev"; $SUDO mount --bind /dev/pts "$ROOT/dev/pts"
$SUDO mount -t proc proc "$ROOT/proc"; $SUDO mount -t sysfs sys "$ROOT/sys"
cat >"$WORK/in-root.sh" <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The three packages from files; their dependencies (and a compiler) from the mirror.
apt-get install -y -qq --no-install-recommends /debs/*.deb g++ pkg-config man-db >/tmp/apt.log 2>&1 ||
  { tail -n 30 /tmp/apt.log; exit 1; }
dpkg -l 'libspool*' 'spool-tools' | grep '^ii'
spool --version
spool --help >/dev/null
spool-dump --help >/dev/null 2>&1 || [ $? = 2 ]
spoolfs --version || spoolfs --help >/dev/null
test -f /usr/share/man/man1/spool.1.gz && test -f /usr/share/man/man3/libspool.3.gz
man -P cat spool >/dev/null 2>&1 || echo "(man: no output, the minbase image may exclude man pages)"
spool init /tmp/q --visibility 10s
echo hello | spool send /tmp/q
spool recv /tmp/q >/tmp/out 2>/tmp/meta
grep -q hello /tmp/out
spool ack /tmp/q "$(sed -n 's/^receipt: //p' /tmp/meta)"
cd /usr/share/doc/libspool-dev/examples
g++ -std=c++20 -Wall -Wextra -Werror producer.cc $(pkg-config --cflags --libs spool) -o /tmp/producer
g++ -std=c++20 -Wall -Wextra -Werror worker.cc $(pkg-config --cflags --libs spool) -o /tmp/worker
ldd /tmp/worker | grep libspool
/tmp/producer /tmp/q 200
/tmp/worker /tmp/q --idle-exit 1 --out /tmp/done
test "$(sort -u /tmp/done | wc -l)" = 200
spool stats /tmp/q
echo "in the fresh root: ok"
EOF
$SUDO cp "$WORK/in-root.sh" "$ROOT/in-root.sh"
SECONDS=0
$SUDO chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  TERM=dumb bash /in-root.sh
echo "   chroot check took ${SECONDS}s"
echo "deb-check: ok"
