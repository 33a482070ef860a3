#!/usr/bin/env bash
# Builds the Windows test executables from Linux and runs them under Wine:
# the library's and the binary's unit tests and the integration tests, then
# a short command-line scenario of the Windows gem-resources.exe (fetch,
# install, status, path) against a local HTTPS origin.
#
#   scripts/wine-test.sh                 # everything
#   scripts/wine-test.sh registry::      # only tests whose name holds a filter
#   WINE_PARTS="lib cli" scripts/wine-test.sh   # some parts only
#
# The build is `cargo test --no-run --target x86_64-pc-windows-gnu` with
# rustup's standard library of the target (or, where rustup cannot add it,
# std built from source by Debian's rustc-web toolchain), linked by
# mingw-w64 (shared with scripts/crosscheck.sh: scripts/cross-env.sh). Wine
# 8 lacks bcryptprimitives.dll, from which std takes its random numbers: a
# test-only stand-in that forwards `ProcessPrng` to `RtlGenRandom`
# (tests/support/wine/bcryptprimitives.c) is built with mingw and found
# through WINEPATH. Tests that need what Wine cannot do are listed, each
# with why, in tests/support/wine/skip.txt.
#
# Knobs (environment):
#   WINE_TARGET_DIR=/var/tmp/gem-resources-cross   the build folder, kept
#                         between runs (shared with the cross-check; a first
#                         build takes 20-40 minutes on two cores)
#   WINE_PARTS="lib bin it cli"   what to run: the library's unit tests,
#                         the binary's, the integration tests, the scenario
#   WINE_TIMEOUT=1800     seconds one test executable may run
#   WINE64=/usr/lib/wine/wine64
#   CROSS_CARGO, CROSS_RUSTC, CROSS_NICE   see scripts/cross-env.sh
#
# Installs with apt-get what it needs when missing (rustc-web, cargo-web,
# rust-web-src, gcc-mingw-w64-x86-64, wine64); one that cannot be installed
# skips the run with a loud line (exit 0). A failing test fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TARGET=x86_64-pc-windows-gnu
PARTS=${WINE_PARTS:-lib bin it cli}
FILTERS=("$@")
WINE64=${WINE64:-/usr/lib/wine/wine64}
WINESERVER=$(dirname "$WINE64")/wineserver
export CARGO_TARGET_DIR=${WINE_TARGET_DIR:-/var/tmp/gem-resources-cross}
mkdir -p "$CARGO_TARGET_DIR"
CARGO_TARGET_DIR=$(cd "$CARGO_TARGET_DIR" && pwd)
WORK=$CARGO_TARGET_DIR/wine

CROSS_TOOL=wine-test
CROSS_UNDONE="the Windows tests were not run"
# shellcheck source=scripts/cross-env.sh
. scripts/cross-env.sh

if ! have_cross_toolchain "$TARGET"; then
    skip "$TARGET" "the target's standard library (rustup target add) or Debian's rustc-web toolchain in the crate's rust-version"
    exit 0
fi
target_envs "$TARGET" || exit 0
need "test -x $WINE64" wine64 || { skip "$TARGET" wine64; exit 0; }
CROSS_ENVS+=("CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc")

# A Unix path as Wine's Z: drive sees it.
windows_path() {
    local p=${1//\//\\}
    echo "Z:$p"
}

# Builds the test executables; prints "NAME KIND PATH" for each.
build_tests() {
    echo "wine-test: building the Windows test executables" >&2
    cross_cargo "$TARGET" test --no-run --locked --message-format=json-render-diagnostics |
        grep '"reason":"compiler-artifact"' | grep -E '"profile":\{[^}]*"test":true' |
        sed -n 's/.*"kind":\["\([a-z-]*\)"\].*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\2 \1 \3/p'
}

# Builds the stand-in bcryptprimitives.dll into $WORK/dll.
build_dll() {
    mkdir -p "$WORK/dll"
    x86_64-w64-mingw32-gcc -O2 -s -shared -o "$WORK/dll/bcryptprimitives.dll" \
        tests/support/wine/bcryptprimitives.c tests/support/wine/bcryptprimitives.def -ladvapi32
}

# The Wine environment of this run: its own prefix in the build folder.
export WINEPREFIX=$WORK/prefix
export WINEDEBUG=-all
export WINEDLLOVERRIDES="mscoree=;mshtml="
export WINEPATH
WINEPATH=$(windows_path "$WORK/dll")

start_wine() {
    if [ ! -f "$WINEPREFIX/system.reg" ]; then
        echo "wine-test: creating the Wine prefix $WINEPREFIX" >&2
        "$WINE64" wineboot --init >/dev/null 2>&1 || true
        "$WINESERVER" -w || true
    fi
}

# The tests of tests/support/wine/skip.txt, as `--skip NAME` arguments.
skip_args() {
    sed -e 's/#.*//' tests/support/wine/skip.txt | awk 'NF { print "--skip"; print $1 }'
}

SUMMARY=()
FAILED=0

# Runs one test executable under Wine and records its result line.
run_tests() {
    local label=$1 exe=$2
    local log=$WORK/logs/$label.log
    local -a skips
    mapfile -t skips < <(skip_args)
    echo "wine-test: running $label ($(basename "$exe"))" >&2
    local start=$SECONDS status=0
    timeout "${WINE_TIMEOUT:-1800}" "$WINE64" "$exe" "${skips[@]}" "${FILTERS[@]}" >"$log" 2>&1 ||
        status=$?
    local result
    result=$(grep -a '^test result:' "$log" | tail -1 || true)
    grep -a -E '^test .* (FAILED|ok)$|^failures:|panicked' "$log" | grep -a -v ' ok$' >&2 || true
    if [ "$status" -ne 0 ] && [ -n "$result" ] && retry_failed "$label" "$exe" "$log"; then
        status=0
        result="$result; passed on a second try: ${RETRIED[*]}"
    fi
    if [ "$status" -ne 0 ] || [ -z "$result" ]; then
        FAILED=1
        [ -n "$result" ] || result="no result (exit status $status; see $log)"
    fi
    SUMMARY+=("$(printf '%-22s %4ss  %s' "$label" $((SECONDS - start)) "$result")")
}

# Wine itself fails now and then where Windows would not (CreateProcess
# answering "Internal error", os error 1359, while many tests start
# processes at once): a run with at most 3 failed tests runs those once more,
# alone and by exact name. They pass only if they pass then; the summary
# names them. More failures, or a second failure, fail the run.
RETRIED=()
retry_failed() {
    local label=$1 exe=$2 log=$3
    local -a failed
    mapfile -t failed < <(grep -a -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/')
    [ "${#failed[@]}" -ge 1 ] && [ "${#failed[@]}" -le 3 ] || return 1
    echo "wine-test: $label: trying ${failed[*]} once more, alone" >&2
    timeout "${WINE_TIMEOUT:-1800}" "$WINE64" "$exe" --exact --test-threads=1 "${failed[@]}" \
        >"$log.again" 2>&1 || return 1
    grep -a -q "^test result: ok. ${#failed[@]} passed" "$log.again" || return 1
    RETRIED=("${failed[@]}")
}

# The command-line scenario: a local HTTPS origin (Python, on Linux) and
# the Windows binary under Wine reaching it through [dev] settings.
run_cli() {
    local exe=$CARGO_TARGET_DIR/$TARGET/debug/gem-resources.exe
    local dir=$WORK/cli
    rm -rf "$dir" && mkdir -p "$dir/www"
    if ! command -v python3 >/dev/null || ! command -v openssl >/dev/null; then
        echo "wine-test: SKIPPED the command-line scenario: needs python3 and openssl" >&2
        SUMMARY+=("$(printf '%-22s %5s  %s' cli - "skipped (no python3 or openssl)")")
        return 0
    fi
    local start=$SECONDS status
    # Not in an `||` list, so that errexit holds inside the scenario.
    set +e
    (cd "$dir" && cli_scenario "$exe") 2>&1 | tee "$WORK/logs/cli.log"
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" -ne 0 ]; then
        FAILED=1
        SUMMARY+=("$(printf '%-22s %4ss  %s' cli $((SECONDS - start)) "FAILED (see $WORK/logs/cli.log)")")
    else
        SUMMARY+=("$(printf '%-22s %4ss  %s' cli $((SECONDS - start)) "ok: fetch, install, status, path")")
    fi
}

# Runs in the scenario's folder; fails at the first step that goes wrong.
cli_scenario() {
    local exe=$1
    set -euo pipefail
    quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj "/CN=wine-test CA" -keyout ca.key -out ca.pem
    quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=cdn.test" -keyout server.key -out server.csr
    printf '%s\n' "subjectAltName=DNS:cdn.test" "basicConstraints=CA:FALSE" \
        "keyUsage=digitalSignature" "extendedKeyUsage=serverAuth" >server.ext
    quiet openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
        -days 2 -extfile server.ext -out server.pem
    head -c 3145728 /dev/urandom >www/model.bin
    head -c 70000 /dev/urandom >www/vocab.txt
    python3 "$ROOT/tests/support/wine/origin.py" www server.pem server.key >port 2>origin.log &
    # shellcheck disable=SC2064 # the pid of this origin, now
    trap "kill $! 2>/dev/null" EXIT
    local port=
    for _ in $(seq 50); do
        port=$(head -1 port 2>/dev/null || true)
        [ -n "$port" ] && break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "wine-test: the origin did not start" >&2; return 1; }
    cat >config.toml <<EOF
store = "store"
[dev]
extra_root_certs = ["ca.pem"]
resolve = { "cdn.test" = ["127.0.0.1"] }
allow_addresses = ["127.0.0.1"]
EOF
    manifest "$port" >notochord.json
    step fetch notochord.json model
    step install wine-demo notochord.json
    step status wine-demo
    step path wine-demo vocab
    step status wine-demo
    # The files the Windows binary says it keeps are the origin's bytes.
    local vocab
    vocab=$(cli "$exe" path wine-demo vocab | tr -d '\r' | sed -e 's/^Z://' -e 's|\\|/|g')
    cmp "$vocab" www/vocab.txt
    echo "wine-test: $vocab is the origin's vocab.txt, byte for byte"
}

# A manifest of two resources on the origin at `port`.
manifest() {
    local port=$1
    cat <<EOF
{
  "id": "wine-demo",
  "name": "Wine demo",
  "version": "1.0.0",
  "description": "Two files from a local origin.",
  "resources": [
    {"id": "model", "url": "https://cdn.test:$port/model.bin", "required": true,
     "size": $(stat -c %s www/model.bin), "sha256": "$(sha256sum www/model.bin | cut -c1-64)",
     "description": "A model"},
    {"id": "vocab", "url": "https://cdn.test:$port/vocab.txt",
     "size": $(stat -c %s www/vocab.txt), "sha256": "$(sha256sum www/vocab.txt | cut -c1-64)",
     "description": "A vocabulary, on first use"}
  ]
}
EOF
}

quiet() {
    "$@" >/dev/null 2>&1
}

# The Windows binary with this scenario's configuration.
cli() {
    local exe=$1
    shift
    NO_COLOR=1 timeout 120 "$WINE64" "$exe" --config config.toml "$@"
}

# Prints one command and its output; fails when it does.
step() {
    echo "\$ gem-resources $*"
    cli "$exe" "$@" 2>&1 | tr -d '\r'
}

# Ends this prefix's Wine processes (only this prefix's).
trap '"$WINESERVER" -k 2>/dev/null || true' EXIT

mkdir -p "$WORK/logs"
# A build that fails fails the run (a partial list would hide it).
if ! build_tests >"$WORK/tests.txt"; then
    echo "wine-test: FAILED: the Windows test executables do not build" >&2
    exit 1
fi
mapfile -t TESTS <"$WORK/tests.txt"
build_dll
start_wine
for entry in "${TESTS[@]}"; do
    read -r name kind exe <<<"$entry"
    case $kind in
    lib) part=lib ;;
    bin) part=bin ;;
    *) part=it ;;
    esac
    [[ " $PARTS " == *" $part "* ]] || continue
    run_tests "$name-$kind" "$exe"
done
[[ " $PARTS " != *" cli "* ]] || run_cli

skipped=$(skip_args | grep -c -v -e '^--skip$' || true)
echo "wine-test: summary ($skipped test(s) skipped by tests/support/wine/skip.txt)"
# A known bug waiting for its fix is said on every run, not only in the file.
grep -E '^[^#[:space:]][^#]*#.*KNOWN BUG' tests/support/wine/skip.txt | sed 's/^\([^ ]*\).*KNOWN BUG:* */  skipped, KNOWN BUG: \1: /' >&2 || true
printf '  %s\n' "${SUMMARY[@]}"
if [ "$FAILED" -ne 0 ]; then
    echo "wine-test: FAILED" >&2
    exit 1
fi
echo "wine-test: all passed"
