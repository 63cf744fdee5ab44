#!/bin/bash
# bash scripts/cross-arm64.sh [MESON_TEST_ARGS...]: scripts/cross-arm.sh for arm64 (aarch64).
exec bash "$(dirname "$0")/cross-arm.sh" arm64 "$@"
