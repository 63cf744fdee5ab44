#!/usr/bin/env bash
# What `meson install` ships, checked from the outside: a staged install of BUILD_DIR
# (meson install --destdir, nothing touches the real /usr), then the C++ examples built
# against the staged tree with nothing but `pkg-config --cflags --libs spool`, and run
# against a temporary queue. Also the soname, the exported symbols (public API only,
# src/libspool.map), the man pages and the installed `spool` binary with
# examples/pipeline.sh.
#
#   bash tests/install_test.sh BUILD_DIR SOURCE_DIR MESON [SANITIZE]
#
# SANITIZE is the build's b_sanitize ("none", "address,undefined"...): the examples are
# then compiled with the same -fsanitize flags, or they could not link the instrumented
# library. SPOOL_CXX names the C++ compiler (default c++), SPOOL_CC the C compiler for the C
# API's example (default cc). Output is TAP, as tests/cli_test.sh.
set -u
if [[ $# -lt 3 || ! -d $1 || ! -d $2 ]]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR MESON [SANITIZE]" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd); MESON=$3; SANITIZE=${4:-none}
CXX_CMD=${SPOOL_CXX:-c++}
CC_CMD=${SPOOL_CC:-cc}
PY=${SPOOL_PYTHON:-python3}  # the python3 meson found (tests/meson.build), that the package is for
export LC_ALL=C

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/spool-install-test.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
STAGE=$ROOT/stage
n=0; failed=0
echo "1..14"
# check NAME CMD...: one TAP line; the command's output goes to the log shown on failure.
check() {
  local name=$1; shift
  n=$((n + 1))
  if "$@" >"$ROOT/log" 2>&1; then
    echo "ok $n - $name"
  else
    echo "not ok $n - $name"; sed 's/^/# /' "$ROOT/log" | tail -n 40; failed=$((failed + 1))
  fi
}

# ---------------------------------------------------------------- 1. the staged install

stage_install() {
  # meson test builds only what the tests depend on, so an installed target that no test
  # needs (spool-dump, say) may not be built yet: build exactly the missing ones (a no-op
  # when the tree is built), then install without a rebuild, so this test never races a
  # build of the whole tree.
  "$MESON" introspect "$BUILD" --installed >"$ROOT/installed.json" || return 1
  mapfile -t missing < <(python3 - "$ROOT/installed.json" "$BUILD" <<'PY'
import json, os, sys
build = sys.argv[2]
for src in json.load(open(sys.argv[1])):
    if src.startswith(build + "/") and not os.path.exists(src):
        print(os.path.relpath(src, build))
PY
)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "building ${missing[*]}"
    ninja -C "$BUILD" "${missing[@]}" || return 1
  fi
  "$MESON" install -C "$BUILD" --destdir "$STAGE" --no-rebuild || return 1
}
check "meson install --destdir" stage_install

# Where things went (the prefix and libdir of the build: /usr/local, lib/x86_64-linux-gnu...).
PC=$(find "$STAGE" -name spool.pc -path '*/pkgconfig/*' | head -n1)
LIBDIR=$(dirname "$(dirname "$PC")")
PREFIX_DIR=$(dirname "$(find "$STAGE" -path '*/bin/spool' | head -n1)")/..

layout() {
  local f
  for f in "$PC" "$LIBDIR/libspool.a" "$LIBDIR/libspool.so" "$LIBDIR/libspool.so.0" \
           "$PREFIX_DIR/bin/spool" "$PREFIX_DIR/bin/spool-dump" \
           "$PREFIX_DIR/share/man/man1/spool.1" "$PREFIX_DIR/share/man/man1/spool-dump.1" \
           "$PREFIX_DIR/share/man/man3/libspool.3" "$PREFIX_DIR/share/man/man3/spool.h.3" \
           "$PREFIX_DIR/include/spool/queue.h" "$PREFIX_DIR/include/spool/lease_keeper.h" \
           "$PREFIX_DIR/include/spool/lease_manager.h" \
           "$PREFIX_DIR/include/spool/status.h" "$PREFIX_DIR/include/spool/spool.h" \
           "$PREFIX_DIR/share/bash-completion/completions/spool" \
           "$PREFIX_DIR/lib/systemd/system/spool-work@.service"; do
    [ -e "$f" ] || { echo "missing: $f"; return 1; }
  done
  # zsh's directory depends on the prefix (dist/meson.build)
  ls "$PREFIX_DIR"/share/zsh/*/_spool >/dev/null || return 1
  if [ -x "$BUILD/fuse/spoolfs" ]; then
    for f in "$PREFIX_DIR/bin/spoolfs" "$PREFIX_DIR/share/man/man1/spoolfs.1"; do
      [ -e "$f" ] || { echo "missing: $f"; return 1; }
    done
  fi
  # the shared library is libspool.so.0 -> libspool.so.0.X.Y, soname libspool.so.0
  [ "$(readlink "$LIBDIR/libspool.so")" = libspool.so.0 ] || { echo "libspool.so -> $(readlink "$LIBDIR/libspool.so")"; return 1; }
  readelf -d "$LIBDIR/libspool.so.0" | grep -q 'Library soname: \[libspool.so.0\]' ||
    { readelf -d "$LIBDIR/libspool.so.0"; return 1; }
  echo "prefix $PREFIX_DIR, libdir $LIBDIR"
}
check "headers, libspool.so.0 (soname), libspool.a, spool.pc, binaries, man pages, completion, unit" layout

# ---------------------------------------------------------------- 2. the exported symbols

symbols() {
  nm -D --defined-only "$LIBDIR/libspool.so.0" | c++filt >"$ROOT/syms" || return 1
  cat "$ROOT/syms"
  # Every defined dynamic symbol is public API in version SPOOL_0 (plus the version node):
  # C++ functions of spool:: and the C API's spool_* functions (spool.h).
  local bad
  bad=$(grep -v ' A SPOOL_0$' "$ROOT/syms" | grep -v ' T spool::.*@@SPOOL_0$' |
        grep -v ' T spool_[a-z_]*@@SPOOL_0$' || true)
  [ -z "$bad" ] || { echo "not public API:"; echo "$bad"; return 1; }
  ! grep -E 'spool::(storage|io|index|sys|queue|format|detail)::|Queue::Impl|LeaseManager::Impl|spool::log\(' "$ROOT/syms" ||
    { echo "internals exported"; return 1; }
  grep -q 'spool::Queue::open(' "$ROOT/syms" && grep -q 'spool::LeaseKeeper::LeaseKeeper(' "$ROOT/syms" &&
    grep -q 'spool::LeaseManager::start(' "$ROOT/syms" ||
    return 1
  # Every function spool.h declares is exported, and nothing else named spool_.
  grep -o '^[a-z0-9_ *]*[ *]spool_[a-z_]*(' "$SRC/include/spool/spool.h" |
    sed 's/.*\(spool_[a-z_]*\)(/\1/' | sort -u >"$ROOT/c_declared"
  grep -o ' T spool_[a-z_]*@@' "$ROOT/syms" | sed 's/ T //; s/@@//' | sort -u >"$ROOT/c_exported"
  [ -s "$ROOT/c_declared" ] && diff "$ROOT/c_declared" "$ROOT/c_exported" ||
    { echo "spool.h declarations (<) and exported C symbols (>) differ"; return 1; }
}
check "libspool.so.0 exports only the public API (nm -D)" symbols

# ---------------------------------------------------------------- 3. the examples, built outside

export PKG_CONFIG_PATH=$(dirname "$PC")
export PKG_CONFIG_SYSROOT_DIR=$STAGE  # the .pc names the real prefix; the files are under STAGE
export LD_LIBRARY_PATH=$LIBDIR
SAN_FLAGS=()
[ "$SANITIZE" != none ] && [ -n "$SANITIZE" ] && SAN_FLAGS=("-fsanitize=$SANITIZE")

build_examples() {
  local flags
  flags=$(pkg-config --cflags --libs spool) || return 1
  echo "pkg-config --cflags --libs spool: $flags"
  # Only spool's own include path: no private requirement's flags (spdlog's -D..., issue 25).
  [ "$(pkg-config --cflags spool | wc -w)" = 1 ] || { echo "extra cflags: $(pkg-config --cflags spool)"; return 1; }
  case $flags in *"$STAGE"*) ;; *) echo "flags do not point into the staged tree"; return 1 ;; esac
  for ex in producer worker lease_manager; do
    # Copied out of the source tree first, so no include path of the tree can be picked up.
    cp "$SRC/examples/$ex.cc" "$ROOT/$ex.cc"
    # shellcheck disable=SC2086  # $CXX_CMD may be "ccache c++", $flags is a word list
    $CXX_CMD -std=c++20 -Wall -Wextra -Werror "${SAN_FLAGS[@]}" "$ROOT/$ex.cc" $flags -o "$ROOT/$ex" ||
      return 1
  done
  # They load the staged libspool.so.0, not one from the build tree or the system.
  ldd "$ROOT/worker" | tee "$ROOT/ldd"
  grep -q "libspool.so.0 => $LIBDIR/libspool.so.0" "$ROOT/ldd"
}
check "examples build with pkg-config --cflags --libs spool against the staged tree" build_examples

run_examples() {
  local q=$ROOT/q out=$ROOT/done.txt
  "$ROOT/producer" "$q" 500 job || return 1
  # Two competing workers; each exits once the queue has been idle for 2 s.
  "$ROOT/worker" "$q" --idle-exit 2 --out "$out" & local w1=$!
  "$ROOT/worker" "$q" --idle-exit 2 --out "$out" & local w2=$!
  wait $w1 || return 1
  wait $w2 || return 1
  # Every message processed exactly once (no lease ran out: 500 quick jobs, 10 s leases).
  [ "$(wc -l <"$out")" = 500 ] || { echo "$(wc -l <"$out") lines"; return 1; }
  [ "$(cut -d' ' -f2 "$out" | sort -u | wc -l)" = 500 ] || { echo "duplicates or gaps"; return 1; }
  [ "$(cut -d' ' -f2 "$out" | sort -t- -k2 -n | tail -n1)" = job-500 ] || return 1
  "$PREFIX_DIR/bin/spool" stats "$q" --json | tee "$ROOT/stats"
  grep -q '"ready":0' "$ROOT/stats" && grep -q '"in_flight":0' "$ROOT/stats" &&
    grep -q '"acked_total":500' "$ROOT/stats" && grep -q '"sent_total":500' "$ROOT/stats"
}
check "producer sends 500, two LeaseKeeper workers process and ack all of them" run_examples

lease_manager_example() {
  local q=$ROOT/qb out=$ROOT/batch.txt
  "$PREFIX_DIR/bin/spool" init "$q" --visibility 1s || return 1
  "$ROOT/producer" "$q" 40 task || return 1
  # Tasks of 1.5 s on leases of 1 s, two workers: the managers renew, so each message is
  # processed once, by one of them.
  # Both append: a worker writing from offset 0 (">") would overwrite the other's lines.
  : >"$out"
  "$ROOT/lease_manager" "$q" --threads 8 --work-ms 1500 --idle-exit 3 >>"$out" & local w1=$!
  "$ROOT/lease_manager" "$q" --threads 8 --work-ms 1500 --idle-exit 3 >>"$out" & local w2=$!
  wait $w1 || return 1
  wait $w2 || return 1
  [ "$(wc -l <"$out")" = 40 ] || { echo "$(wc -l <"$out") lines"; return 1; }
  [ "$(cut -d' ' -f1 "$out" | sort -u | wc -l)" = 40 ] || { echo "duplicates"; return 1; }
  "$PREFIX_DIR/bin/spool" stats "$q" --json | grep -q '"acked_total":40'
}
check "examples/lease_manager.cc: 40 tasks longer than the visibility, two workers, each processed once" lease_manager_example

c_example() {
  # The C API's example, compiled as C99 with the C compiler and pkg-config alone.
  local q=$ROOT/qc out=$ROOT/c-done.txt flags
  flags=$(pkg-config --cflags --libs spool) || return 1
  cp "$SRC/examples/worker.c" "$ROOT/worker.c"
  # shellcheck disable=SC2086
  $CC_CMD -std=c99 -Wall -Wextra -Wpedantic -Werror "${SAN_FLAGS[@]}" "$ROOT/worker.c" $flags \
    -o "$ROOT/c-worker" || return 1
  ldd "$ROOT/c-worker" | grep -q "libspool.so.0 => $LIBDIR/libspool.so.0" || return 1
  "$ROOT/producer" "$q" 200 c || return 1
  "$ROOT/c-worker" "$q" --idle-exit 1 --out "$out" || return 1
  [ "$(cut -d' ' -f2 "$out" | sort -u | wc -l)" = 200 ] || { wc -l "$out"; return 1; }
  "$PREFIX_DIR/bin/spool" stats "$q" --json | grep -q '"acked_total":200'
}
check "the C example (spool.h) builds with cc -std=c99 and pkg-config, acks 200" c_example

python_package() {
  # The spool package as meson installed it (purelib of meson's Python), on the staged
  # libspool.so.0 found through LD_LIBRARY_PATH (no SPOOL_LIBRARY), with the installed CLI.
  local init q=$ROOT/qpy
  # An ASan/TSan-instrumented libspool cannot be dlopen()ed by an uninstrumented python3.
  if [ "$SANITIZE" != none ] && [ -n "$SANITIZE" ]; then echo "skipped: sanitized build"; return 0; fi
  init=$(find "$STAGE" -path '*/spool/__init__.py' | head -n1)
  [ -n "$init" ] && [ -e "$(dirname "$init")/_capi.py" ] || { echo "spool package not installed"; return 1; }
  "$PREFIX_DIR/bin/spool" init "$q" >/dev/null && "$PREFIX_DIR/bin/spool" send "$q" hello-from-the-cli >/dev/null || return 1
  env -u SPOOL_LIBRARY PYTHONPATH="$(dirname "$(dirname "$init")")" python3 - "$q" "$STAGE" <<'PY' || return 1
import sys, spool
print("spool package:", spool.__file__, "library:", spool.library_path)
assert spool.__file__.startswith(sys.argv[2]), spool.__file__
with spool.Queue(sys.argv[1]) as q:
    (m,) = q.receive(wait=1)
    assert m.text == "hello-from-the-cli", m
    m.ack()
    q.send("hello-from-python")
PY
  "$PREFIX_DIR/bin/spool" stats "$q" --json | grep -q '"acked_total":1' || return 1
  "$PREFIX_DIR/bin/spool" recv "$q" 2>&1 | grep -q hello-from-python
}
check "the installed Python package (import spool) talks to the installed CLI" python_package

python_where_python_looks() {
  # Issue 43: `meson install` put the package in PREFIX/lib/python3/dist-packages, which
  # Debian's python3 does not search: it must go where meson's python3 (the one the
  # package is for) looks, so that `import spool` works with no PYTHONPATH.
  local init dir
  init=$(find "$STAGE" -path '*/spool/__init__.py' | head -n1)
  [ -n "$init" ] || { echo "spool package not installed"; return 1; }
  dir=$(dirname "$(dirname "$init")")
  dir=${dir#"$STAGE"}
  case "$dir" in /usr/*) ;; *) echo "note: prefix $dir is not under /usr: not checked"; return 0 ;; esac
  echo "installed into $dir; $PY's sys.path:"
  "$PY" -c 'import sys; print(sys.path); sys.exit(sys.argv[1] not in sys.path)' "$dir" || return 1
  # The installed package knows where meson put the library (for before ldconfig).
  grep -qF "LIBDIR = \"${LIBDIR#"$STAGE"}\"" "$STAGE$dir/spool/_install.py" || { cat "$STAGE$dir/spool/_install.py"; return 1; }
}
check "meson install puts the Python package on meson's python3's sys.path" python_where_python_looks

pip_install() {
  # Issue 43: `pip install ./python` into a venv (python/pyproject.toml), then the package
  # on the staged libspool.so.0. --no-build-isolation --no-index: no network here, so the
  # build backend (setuptools) is the system's.
  if [ "$SANITIZE" != none ] && [ -n "$SANITIZE" ]; then echo "skipped: sanitized build"; return 0; fi
  "$PY" -c 'import setuptools, venv, ensurepip' 2>/dev/null ||
    { echo "SKIP: $PY lacks setuptools or venv (python3-setuptools, python3-venv: scripts/deps.sh)"; return 0; }
  local q=$ROOT/qpip
  cp -r "$SRC/python" "$ROOT/pysrc" && rm -rf "$ROOT/pysrc/tests" || return 1
  grep -q "^version = \"$("$MESON" introspect "$BUILD" --projectinfo | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["version"])')\"" \
    "$ROOT/pysrc/pyproject.toml" || { echo "pyproject.toml's version is not meson's"; return 1; }
  "$PY" -m venv --system-site-packages "$ROOT/venv" || return 1
  "$ROOT/venv/bin/pip" install -q --no-build-isolation --no-index "$ROOT/pysrc" || return 1
  "$PREFIX_DIR/bin/spool" init "$q" >/dev/null || return 1
  (cd "$ROOT" && env -u SPOOL_LIBRARY -u PYTHONPATH LD_LIBRARY_PATH="$LIBDIR" "$ROOT/venv/bin/python" - "$q" "$ROOT/venv" <<'PY') || return 1
import sys, spool
print("spool package:", spool.__file__)
assert spool.__file__.startswith(sys.argv[2]), spool.__file__
with spool.Queue(sys.argv[1]) as q:
    q.send("hello-from-pip")
PY
  "$PREFIX_DIR/bin/spool" recv "$q" 2>&1 | grep -q hello-from-pip
}
check "pip install ./python into a venv; import spool sends through the staged libspool" pip_install

library_not_found() {
  # Issue 43: a library the dynamic linker cannot find yet. The ImportError says what to
  # do (ldconfig), and scripts/ldconfig.sh, which meson install runs, runs ldconfig
  # (a stand-in here that records its call) unless the install is staged (DESTDIR).
  if [ "$SANITIZE" != none ] && [ -n "$SANITIZE" ]; then echo "skipped: sanitized build"; return 0; fi
  mkdir -p "$ROOT/nolib/spool" "$ROOT/fakebin" || return 1
  cp "$SRC"/python/spool/*.py "$ROOT/nolib/spool/" || return 1
  if ! "$PY" -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("spool") is not None)'; then
    echo "note: this machine's ldconfig cache has a libspool: the ImportError is not checked"
  else
    (cd "$ROOT" && env -u SPOOL_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$ROOT/nolib" "$PY" -c 'import spool') \
      >/dev/null 2>"$ROOT/import.err" && { echo "import spool worked without a library"; return 1; }
    cat "$ROOT/import.err"
    grep -q "ImportError: .*ldconfig" "$ROOT/import.err" || return 1
  fi
  printf '#!/bin/sh\necho "ldconfig $*" >>"%s"\n' "$ROOT/ldconfig.calls" >"$ROOT/fakebin/ldconfig"
  chmod +x "$ROOT/fakebin/ldconfig"
  DESTDIR=$ROOT/x PATH="$ROOT/fakebin:$PATH" sh "$SRC/scripts/ldconfig.sh" /usr/local/lib || return 1
  [ ! -e "$ROOT/ldconfig.calls" ] || { echo "ldconfig ran for a staged install"; return 1; }
  env -u DESTDIR PATH="$ROOT/fakebin:$PATH" sh "$SRC/scripts/ldconfig.sh" /opt/x/lib 2>"$ROOT/ldc.err" || return 1
  grep -qx "ldconfig " "$ROOT/ldconfig.calls" || { echo "ldconfig was not run"; return 1; }
  grep -q "LD_LIBRARY_PATH=/opt/x/lib" "$ROOT/ldc.err" || { cat "$ROOT/ldc.err"; return 1; }
  grep -q "scripts/ldconfig.sh" "$SRC/meson.build"
}
check "a library not found yet: the ImportError says ldconfig; meson install runs ldconfig" library_not_found

# ---------------------------------------------------------------- 4. the installed tools

tools() {
  "$PREFIX_DIR/bin/spool" --help | grep -q 'work' || return 1
  "$PREFIX_DIR/bin/spool" --version || return 1
  if [ -x "$PREFIX_DIR/bin/spoolfs" ]; then "$PREFIX_DIR/bin/spoolfs" --help || return 1; fi
  # The man pages are well-formed roff (groff warns on stderr otherwise).
  if command -v groff >/dev/null; then
    for m in "$PREFIX_DIR"/share/man/man*/*; do
      groff -man -Tutf8 -ww -z "$m" 2>"$ROOT/groff" || return 1
      [ ! -s "$ROOT/groff" ] || { echo "$m:"; cat "$ROOT/groff"; return 1; }
    done
  fi
}
check "installed spool, spoolfs --help; man pages render" tools

pipeline() {
  mkdir -p "$ROOT/files" && for i in $(seq 1 40); do echo "file $i" >"$ROOT/files/f$i"; done
  (cd "$ROOT" && SPOOL="$PREFIX_DIR/bin/spool" sh "$SRC/examples/pipeline.sh" "$ROOT/files" "$ROOT/sums") ||
    return 1
  [ "$(wc -l <"$ROOT/sums")" = 40 ] && ! grep -q unreadable "$ROOT/sums"
}
check "examples/pipeline.sh with the installed spool (find | send --lines; work -j 4)" pipeline

static_link() {
  # libspool.a with `pkg-config --static`: the private requirements (liburing, libxxhash,
  # spdlog) come along.
  local flags
  flags=$(pkg-config --cflags --libs --static spool) || return 1
  echo "$flags"
  # shellcheck disable=SC2086
  $CXX_CMD -std=c++20 "${SAN_FLAGS[@]}" "$ROOT/producer.cc" $(pkg-config --cflags spool) \
    "$LIBDIR/libspool.a" $(pkg-config --libs --static spool | sed 's/\(^\| \)-lspool\( \|$\)/ /') \
    -o "$ROOT/producer-static" || return 1
  ! ldd "$ROOT/producer-static" | grep -q libspool || return 1
  "$ROOT/producer-static" "$ROOT/q2" 10 static
}
check "producer links libspool.a statically (pkg-config --static)" static_link

[ "$failed" = 0 ]
