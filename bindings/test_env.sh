# Sourced by the bindings' test scripts (go/run_tests.sh, node/run_tests.sh) and by
# bench/bench_bindings.sh.

# skip_under_sanitizer WHAT SANITIZE: exits 77 (meson's SKIP) when b_sanitize is not none.
# A go or node binary (uninstrumented) cannot load a libspool built with a sanitizer: the
# sanitizer's runtime must come first. capi_test covers the C layer under the sanitizers.
skip_under_sanitizer() {
  if [ "$2" != none ]; then
    echo "SKIP: $1 under b_sanitize=$2 (an uninstrumented program cannot load an instrumented libspool)"
    exit 77
  fi
}

# Points pkg-config at this build's libspool.
# uninstalled_pc DIR SRC_ROOT LIBDIR writes DIR/spool.pc (the tree's include/ and the shared
# library in LIBDIR, with an rpath so test programs find it without LD_LIBRARY_PATH) and
# puts DIR first on PKG_CONFIG_PATH. Meson's own meson-uninstalled/spool-uninstalled.pc
# cannot serve: spool.pc names the library by -L${libdir} flags (meson.build says why),
# which there point at the not-yet-installed libdir.
uninstalled_pc() {
  local dir=$1 src=$2 libdir=$3
  mkdir -p "$dir"
  cat >"$dir/spool.pc" <<PC
Name: spool
Description: libspool of the build tree $libdir
Version: 0
Cflags: -I$src/include
Libs: -L$libdir -lspool -Wl,-rpath,$libdir
PC
  export PKG_CONFIG_PATH="$dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
}
