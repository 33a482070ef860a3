#!/usr/bin/env bash
# Chaos soak of `gem-resources serve` (issue 23): a local HTTPS origin whose
# routes misbehave at random, gems coming and going, policy edits (SIGHUP and
# file changes), concurrent `path` and `verify` processes, kill -9 and
# restarts, and a small store file system filled and freed; the invariants are
# checked throughout and at the end (see tests/support/soak/mod.rs).
#
#   scripts/soak.sh            # 10 minutes of faults
#   scripts/soak.sh 30         # 30 minutes
#   SOAK_SEED=1234 scripts/soak.sh 5     # replay a run
#
# Knobs (environment):
#   SOAK_SEED     the seed of every random choice (default: from the clock);
#                 printed at the start and in the summary
#   SOAK_DIR      work folder (default: a new one under ${TMPDIR:-/tmp});
#                 kept at the end, with events.log, processes.log, serve-*.out
#   SOAK_QUIET=1  print only the summary, not every event
#   SOAK_NO_DISK=1  do not mount the small tmpfs for the store
#
# The store lives on a 64 MiB tmpfs mounted here when run as root and mount
# works; otherwise the disk-full part is skipped, with a message. Only
# loopback is used: 127.0.0.1 for the origin, 127.0.0.2 as the refused
# address (counted, must stay unreached). Not part of CI: the test suite runs
# a 60-second version (tests/it/soak.rs).
set -euo pipefail

MINUTES=${1:-10}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

echo "soak: building the release binary and the soak program"
cargo build --release --locked --bin gem-resources --example soak

DIR=${SOAK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gem-soak.XXXXXX")}
mkdir -p "$DIR"
DISK_ARGS=()
MOUNTED=""
cleanup() {
    if [[ -n "$MOUNTED" ]]; then
        umount "$MOUNTED" 2>/dev/null || umount -l "$MOUNTED" 2>/dev/null || true
    fi
}
trap cleanup EXIT
if [[ -z "${SOAK_NO_DISK:-}" && "$(id -u)" == 0 ]]; then
    mkdir -p "$DIR/disk"
    if mount -t tmpfs -o size=64m,mode=0700 gem-soak "$DIR/disk" 2>/dev/null; then
        MOUNTED="$DIR/disk"
        DISK_ARGS=(--disk "$DIR/disk")
        echo "soak: store on a 64 MiB tmpfs at $DIR/disk (filled and freed during the run)"
    else
        echo "soak: could not mount a tmpfs here; skipping the full-disk faults"
    fi
else
    echo "soak: not root (or SOAK_NO_DISK set); skipping the full-disk faults"
fi

ARGS=(--bin "$TARGET/release/gem-resources" --dir "$DIR" --minutes "$MINUTES")
if [[ -n "${SOAK_SEED:-}" ]]; then
    ARGS+=(--seed "$SOAK_SEED")
fi
if [[ -n "${SOAK_QUIET:-}" ]]; then
    ARGS+=(--quiet)
fi
echo "soak: $MINUTES minute(s) of faults in $DIR"
status=0
"$TARGET/release/examples/soak" "${ARGS[@]}" "${DISK_ARGS[@]}" | tee "$DIR/summary.txt" || status=$?
echo "soak: logs in $DIR"
exit "$status"
