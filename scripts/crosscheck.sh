#!/usr/bin/env bash
# Type-checks the crate for the desktop platforms from Linux:
# `cargo check --all-targets --locked` (lib, bin, tests, examples, benches)
# for each target, with warnings as errors.
#
#   scripts/crosscheck.sh                          # all three targets
#   scripts/crosscheck.sh x86_64-pc-windows-gnu    # one target
#
# The standard library of each target is built from source
# (`-Zbuild-std`) with Debian's rustc-web toolchain (`/usr/bin/rustc` and
# `/usr/bin/cargo`, std sources from rust-web-src), so no rustup target is
# needed. `ring` compiles C: mingw-w64 for Windows; clang-22 with a small
# TargetConditionals.h for macOS (enough to check; linking for macOS needs
# Apple's SDK and is not done).
#
# Knobs (environment):
#   CROSS_TARGET_DIR=$CARGO_TARGET_DIR/cross (target/cross)   kept between
#                                   runs (a cold run takes about 20 minutes
#                                   on two cores, a warm one about a minute)
#   CROSS_CARGO=/usr/bin/cargo  CROSS_RUSTC=/usr/bin/rustc
#   CROSS_NICE=19                   niceness of the builds
#
# Installs with apt-get what it needs when missing (rustc-web, cargo-web,
# rust-web-src, gcc-mingw-w64-x86-64, clang-22).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(x86_64-pc-windows-gnu x86_64-apple-darwin aarch64-apple-darwin)
fi
CARGO=${CROSS_CARGO:-/usr/bin/cargo}
RUSTC=${CROSS_RUSTC:-/usr/bin/rustc}
NICE=${CROSS_NICE:-19}
export CARGO_TARGET_DIR=${CROSS_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/cross}
mkdir -p "$CARGO_TARGET_DIR"
CARGO_TARGET_DIR=$(cd "$CARGO_TARGET_DIR" && pwd)

# Installs the Debian packages named when `probe` fails.
need() {
    local probe=$1
    shift
    if ! eval "$probe" >/dev/null 2>&1; then
        echo "crosscheck: installing $*" >&2
        local sudo=
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2 ||
            { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y --no-install-recommends "$@" >&2; }
    fi
}

# A tool that cannot be installed (no package registry reachable) skips the
# check with a loud line instead of failing: it says nothing about the code.
# A check that runs and fails always fails.
skip() {
    echo "crosscheck: SKIPPED $1: cannot install $2 (the code was not checked)" >&2
}
if ! need "test -x $RUSTC && test -x $CARGO" rustc-web cargo-web ||
    ! need "test -f \$($RUSTC --print sysroot)/lib/rustlib/src/rust/library/Cargo.lock" rust-web-src; then
    skip "${TARGETS[*]}" "Debian's rustc-web toolchain"
    exit 0
fi

# The few TARGET_OS_* macros ring's C code asks Apple's SDK for.
apple_include() {
    local dir=$CARGO_TARGET_DIR/apple-include
    mkdir -p "$dir"
    cat >"$dir/TargetConditionals.h" <<'EOF'
#pragma once
#define TARGET_OS_MAC 1
#define TARGET_OS_OSX 1
#define TARGET_OS_IPHONE 0
#define TARGET_OS_IOS 0
#define TARGET_OS_WATCH 0
#define TARGET_OS_TV 0
#define TARGET_OS_SIMULATOR 0
#define TARGET_OS_EMBEDDED 0
EOF
    echo "$dir"
}

check() {
    local target=$1
    local var=${target//-/_}
    local -a envs=()
    case $target in
    *-windows-gnu)
        need "command -v x86_64-w64-mingw32-gcc" gcc-mingw-w64-x86-64 ||
            { skip "$target" gcc-mingw-w64-x86-64; return 0; }
        envs+=("CC_$var=x86_64-w64-mingw32-gcc" "AR_$var=x86_64-w64-mingw32-ar")
        ;;
    *-apple-darwin)
        need "command -v clang-22" clang-22 || { skip "$target" clang-22; return 0; }
        local inc
        inc=$(apple_include)
        envs+=("CC_$var=clang-22" "AR_$var=ar"
            "CFLAGS_$var=-ffreestanding -nostdlibinc -DRING_CORE_NOSTDLIBINC=1 -I$inc")
        ;;
    esac
    echo "crosscheck: $target" >&2
    env "${envs[@]}" RUSTC="$RUSTC" RUSTC_BOOTSTRAP=1 RUSTFLAGS="-D warnings" \
        nice -n "$NICE" "$CARGO" check --all-targets --locked \
        -Zbuild-std=std,panic_abort --target "$target"
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
