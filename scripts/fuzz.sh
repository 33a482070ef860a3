#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 60), one after the
# other at the lowest CPU priority, and says where crashes went.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz
# --locked`). Not part of CI. Each target starts from its committed seeds
# (fuzz/seeds/<target>) and grows a local corpus (fuzz/corpus/<target>);
# crashing inputs land in fuzz/artifacts/<target>/, logs in fuzz/logs/.
set -euo pipefail

seconds="${1:-60}"
shift || true
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root/fuzz"

if ! cargo +nightly fuzz --help >/dev/null 2>&1; then
    echo "fuzz.sh: needs a nightly toolchain and cargo-fuzz (cargo install cargo-fuzz --locked)" >&2
    exit 2
fi

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi

echo "building the fuzz targets..."
nice -n 19 cargo +nightly fuzz build -O

# Runs the built binaries directly, so editing the sources while the loop
# runs cannot rebuild a target half way. FUZZ_KEEP_GOING=1 restarts a target
# after a crash until its time is used up, so it still gets its full time.
bin_dir="target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
mkdir -p logs
failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target" "artifacts/$target"
    echo "== $target: ${seconds}s"
    start=$(date +%s)
    : >"logs/$target.log"
    status=0
    execs=0
    while :; do
        left=$((seconds - ($(date +%s) - start)))
        [ "$left" -gt 0 ] || break
        run=0
        nice -n 19 "$bin_dir/$target" "corpus/$target" "seeds/$target" \
            -artifact_prefix="artifacts/$target/" -max_total_time="$left" -timeout=10 \
            -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
            >>"logs/$target.log" 2>&1 || run=$?
        done_runs="$(grep -Eo '^stat::number_of_executed_units: *[0-9]+' "logs/$target.log" |
            tail -n1 | grep -Eo '[0-9]+$' || true)"
        if [ "$run" -eq 0 ]; then
            execs=$((execs + ${done_runs:-0}))
            break
        fi
        status=$run
        last="$(grep -Eo '^#[0-9]+' "logs/$target.log" | tail -n1 | tr -d '#' || true)"
        execs=$((execs + ${last:-0}))
        [ "${FUZZ_KEEP_GOING:-0}" = 1 ] || break
        echo "-- restarting $target after a crash" >>"logs/$target.log"
    done
    elapsed=$(($(date +%s) - start))
    crashes=$(find "artifacts/$target" -type f | wc -l)
    echo "   ran ${elapsed}s, about ${execs} execs, ${crashes} crashing inputs in fuzz/artifacts/$target/"
    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        failed+=("$target")
        grep -E '^(thread .* panicked|==[0-9]+== ERROR)' -A2 "logs/$target.log" | head -n 6 || true
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "crashes in: ${failed[*]}; logs in fuzz/logs/ (reproduce: cd fuzz && cargo +nightly fuzz run TARGET artifacts/TARGET/FILE)"
    exit 1
fi
echo "no crashes; corpora in fuzz/corpus/, logs in fuzz/logs/"
