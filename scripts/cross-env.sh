# Sourced by scripts/crosscheck.sh and scripts/wine-test.sh: the toolchain
# that builds the standard library of another target from source, and the
# C compilers `ring` needs for each target.
#
# Set before sourcing: CROSS_TOOL (the name messages start with) and
# CROSS_UNDONE (what a skip leaves undone, e.g. "the code was not checked").
#
# Knobs (environment):
#   CROSS_CARGO=/usr/bin/cargo  CROSS_RUSTC=/usr/bin/rustc   Debian's
#                                   rustc-web toolchain (std sources from
#                                   rust-web-src, found through its sysroot),
#                                   used only when rustup cannot add the
#                                   targets' standard libraries
#   CROSS_NICE=19                   niceness of the builds

CARGO=${CROSS_CARGO:-/usr/bin/cargo}
RUSTC=${CROSS_RUSTC:-/usr/bin/rustc}
NICE=${CROSS_NICE:-19}

# Installs the Debian packages named when `probe` fails.
need() {
    local probe=$1
    shift
    if ! eval "$probe" >/dev/null 2>&1; then
        echo "$CROSS_TOOL: installing $*" >&2
        local sudo=
        [ "$(id -u)" -eq 0 ] || sudo=sudo
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2 ||
            { $sudo apt-get update >&2 && $sudo env DEBIAN_FRONTEND=noninteractive \
                apt-get install -y --no-install-recommends "$@" >&2; }
    fi
}

# A tool that cannot be installed (no package registry reachable) skips the
# work with a loud line instead of failing: it says nothing about the code.
# Work that runs and fails always fails.
skip() {
    echo "$CROSS_TOOL: SKIPPED $1: cannot install $2 ($CROSS_UNDONE)" >&2
}

# The toolchain used: "rustup" (the machine's own, with the target's
# standard library added by `rustup target add`) when rustup can add the
# targets, else "web" (Debian's rustc-web, std built from source).
CROSS_MODE=

# Whether rustup has, or can add, the standard library of every target
# given; sets CROSS_MODE=rustup then.
rustup_targets() {
    command -v rustup >/dev/null 2>&1 || return 1
    local installed t
    installed=$(rustup target list --installed 2>/dev/null) || return 1
    for t in "$@"; do
        if ! grep -qx "$t" <<<"$installed"; then
            echo "$CROSS_TOOL: adding the $t standard library (rustup target add)" >&2
            timeout 600 rustup target add "$t" >&2 || return 1
        fi
    done
    CROSS_MODE=rustup
}

# A toolchain for `targets`: rustup's when it can add them, else Debian's
# rustc-web (see have_toolchain).
have_cross_toolchain() {
    if rustup_targets "$@"; then
        return 0
    fi
    have_toolchain && CROSS_MODE=web
}

# Whether Debian's rustc-web toolchain and its std sources are there (or
# could be installed), in a version that builds the crate (its
# `rust-version` in Cargo.toml). An older one, the only one the package
# registry offers, is said loudly: the work is skipped, as for a toolchain
# that cannot be installed.
have_toolchain() {
    need "test -x $RUSTC && test -x $CARGO" rustc-web cargo-web &&
        need "test -f \$($RUSTC --print sysroot)/lib/rustlib/src/rust/library/Cargo.lock" rust-web-src ||
        return 1
    local want have
    want=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
    have=$($RUSTC --version | awk '{print $2}')
    if [ -n "$want" ] && [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
        echo "$CROSS_TOOL: Debian's rustc-web is $have, older than the crate's rust-version $want" >&2
        return 1
    fi
}

# The few TARGET_OS_* macros ring's C code asks Apple's SDK for; prints the
# folder holding them.
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

# Sets CROSS_ENVS to the C compiler settings of `target`, installing the
# compiler when missing; fails (after a skip line) when it cannot be.
target_envs() {
    local target=$1
    local var=${target//-/_}
    CROSS_ENVS=()
    case $target in
    *-windows-gnu)
        need "command -v x86_64-w64-mingw32-gcc" gcc-mingw-w64-x86-64 ||
            { skip "$target" gcc-mingw-w64-x86-64; return 1; }
        CROSS_ENVS+=("CC_$var=x86_64-w64-mingw32-gcc" "AR_$var=x86_64-w64-mingw32-ar")
        ;;
    *-apple-darwin)
        # Any clang compiles for another target; the newest Debian offers.
        local clang
        clang=$(command -v clang-22 clang-19 clang 2>/dev/null | head -1 || true)
        if [ -z "$clang" ]; then
            need "command -v clang-19" clang-19 || { skip "$target" clang-19; return 1; }
            clang=$(command -v clang-19)
        fi
        local inc
        inc=$(apple_include)
        CROSS_ENVS+=("CC_$var=$clang" "AR_$var=ar"
            "CFLAGS_$var=-ffreestanding -nostdlibinc -DRING_CORE_NOSTDLIBINC=1 -I$inc")
        ;;
    esac
}

# Runs `cargo SUBCOMMAND ARGS…` for `target` (set CROSS_ENVS first with
# target_envs), warnings as errors, nice'd: with rustup's toolchain and the
# target's standard library, or with rustc-web and std built from source.
cross_cargo() {
    local target=$1
    shift
    if [ "$CROSS_MODE" = rustup ]; then
        env "${CROSS_ENVS[@]}" RUSTFLAGS="-D warnings" \
            nice -n "$NICE" cargo "$@" --target "$target"
    else
        env "${CROSS_ENVS[@]}" RUSTC="$RUSTC" RUSTC_BOOTSTRAP=1 RUSTFLAGS="-D warnings" \
            nice -n "$NICE" "$CARGO" "$@" -Zbuild-std=std,panic_abort --target "$target"
    fi
}
