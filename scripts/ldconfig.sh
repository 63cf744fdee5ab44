#!/bin/sh
# Run by `meson install` (meson.build: add_install_script) with the library's directory:
# a newly installed shared library is found by programs only once ldconfig has refreshed
# the dynamic linker's cache, else they fail to start with "libspool.so.0: cannot open
# shared object file" (issue 43). A staged install (DESTDIR: a package build) is left
# alone; the package's own scripts run ldconfig where it is installed.
# Never fails the install: if ldconfig cannot run, or the directory is not one the dynamic
# linker searches, it says what to do instead.
libdir=$1
[ -n "${DESTDIR:-}" ] && exit 0
PATH=$PATH:/sbin:/usr/sbin
if ! ldconfig 2>/dev/null; then
  echo "spool: could not run ldconfig (not root?): run 'sudo ldconfig', or programs will not find libspool.so.0 in $libdir" >&2
  exit 0
fi
if ! ldconfig -p | grep -qF "=> $libdir/libspool.so.0"; then
  echo "spool: $libdir is not a directory the dynamic linker searches: add it to /etc/ld.so.conf.d/ and run ldconfig, or set LD_LIBRARY_PATH=$libdir, or programs will not find libspool.so.0" >&2
fi
exit 0
