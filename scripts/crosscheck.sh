#!/usr/bin/env bash
# Type-checks the crate for the desktop platforms from Linux:
# `cargo check --all-targets --locked` (lib, bin, tests, examples, benches)
# for each target, with warnings as errors.
#
#   scripts/crosscheck.sh                          # all three targets
#   scripts/crosscheck.sh x86_64-pc-windows-gnu    # one target
#
# The standard library of each target comes from rustup (`rustup target
# add`, done here when missing); where rustup cannot add it, it is built
# from source (`-Zbuild-std`) with Debian's rustc-web toolchain
# (`/usr/bin/rustc` and `/usr/bin/cargo`, std sources from rust-web-src).
# `ring` compiles C: mingw-w64 for Windows; clang (clang-19 from Debian
# when none is there) with a small TargetConditionals.h for macOS (enough
# to check; linking for macOS needs Apple's SDK and is not done).
#
# Knobs (environment):
#   CROSS_TARGET_DIR=$CARGO_TARGET_DIR/cross (target/cross)   kept between
#                                   runs (a cold run takes about 20 minutes
#                                   on two cores, a warm one about a minute)
#   CROSS_CARGO, CROSS_RUSTC, CROSS_NICE   see scripts/cross-env.sh
#
# Installs with apt-get what it needs when missing (gcc-mingw-w64-x86-64,
# clang-19; rustc-web, cargo-web and rust-web-src only without rustup).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(x86_64-pc-windows-gnu x86_64-apple-darwin aarch64-apple-darwin)
fi
export CARGO_TARGET_DIR=${CROSS_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/cross}
mkdir -p "$CARGO_TARGET_DIR"
CARGO_TARGET_DIR=$(cd "$CARGO_TARGET_DIR" && pwd)

CROSS_TOOL=crosscheck
CROSS_UNDONE="the code was not checked"
# shellcheck source=scripts/cross-env.sh
. scripts/cross-env.sh

if ! have_cross_toolchain "${TARGETS[@]}"; then
    skip "${TARGETS[*]}" "the targets' standard libraries (rustup target add) or Debian's rustc-web toolchain in the crate's rust-version"
    exit 0
fi

check() {
    local target=$1
    target_envs "$target" || return 0
    echo "crosscheck: $target" >&2
    cross_cargo "$target" check --all-targets --locked
}

failed=()
for t in "${TARGETS[@]}"; do
    check "$t" || failed+=("$t")
done
if [ ${#failed[@]} -ne 0 ]; then
    echo "crosscheck: failed on ${failed[*]}" >&2
    exit 1
fi
echo "crosscheck: clean on ${TARGETS[*]}" >&2
