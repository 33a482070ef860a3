#!/usr/bin/env bash
# The branch-office benchmark of the [cache] (docs/cache.md): N stores, each
# its own process, store and configuration, behind a far emulated link to
# the origin, with the office's OCI registry near them.
#
#   sudo scripts/bench-office.sh                  # N = 1 5 20, a 64 MiB file
#   OFFICE_N="1 5" OFFICE_MIB=16 sudo scripts/bench-office.sh
#
# Knobs (environment):
#   OFFICE_N="1 5 20"     office sizes
#   OFFICE_MIB=64         the file's size
#   OFFICE_MODES="nocache aria2c cache together"   what runs for each N:
#     nocache   every store fetches from the origin at once (no [cache])
#     aria2c    every desktop runs aria2c -x8 -s8 -k1M --checksum from the
#               origin at once
#     cache     the first store fetches from the origin and seeds the
#               registry (`cache push`, at the default push_max_bytes_per_sec
#               of 20 MB/s), then the other N-1 fetch at once (served by the
#               registry); with N = 1 the time ends at the first file
#     together  every store starts at once with [cache] push = true: all
#               miss, so all fetch from the origin (the cache helps the
#               offices that come after)
#   OFFICE_LINK="80 0 0.5 100"   link.sh up DELAY_MS JITTER_MS LOSS_PCT
#                         RATE_MBIT: the far link (bench.sh's "far": RTT
#                         160 ms, 0.5 % loss, 100 Mbit/s)
#   BENCH_LINK_SH=../shared/tools/wanemu/link.sh
#   BENCH_BIN=target/release/gem-resources   (built when missing)
#   BENCH_DIR=/var/tmp
#
# Topology: nginx (the origin, https) in the namespace gr-srv on 10.88.0.1,
# behind the emulated link; the stores, aria2c and the registry
# (docker-registry, https from the same throwaway CA) in gr-cli, the
# registry on 10.88.0.2: the near link is the office's own network, not
# emulated. Reported per mode and N: bytes the origin sent (nginx's
# $bytes_sent, summed), and the time from the start to the last store's
# verified file (every process exited 0).
#
# Needs root (network namespaces), nginx, aria2c, docker-registry, openssl,
# gcc. Not part of CI. Brings the link up and down itself: refuses to run
# when the namespaces exist already (another benchmark is using them).
set -euo pipefail

NS=${OFFICE_N:-"1 5 20"}
MIB=${OFFICE_MIB:-64}
MODES=${OFFICE_MODES:-"nocache aria2c cache together"}
LINK=${OFFICE_LINK:-"80 0 0.5 100"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LINK_SH=${BENCH_LINK_SH:-$ROOT/../../shared/tools/wanemu/link.sh}
[ -x "$LINK_SH" ] || LINK_SH=$ROOT/../shared/tools/wanemu/link.sh
BIN=${BENCH_BIN:-$ROOT/target/release/gem-resources}
BASE=${BENCH_DIR:-/var/tmp}
HOST=bench.test
REG=registry.bench.test
SRV_IP=10.88.0.1
CLI_IP=10.88.0.2
PORT=8443
REG_PORT=5000
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
IN_CLI=(ip netns exec gr-cli)

say() { printf '%s\n' "$*" >&2; }

for tool in aria2c openssl gcc /usr/bin/docker-registry "$NGINX"; do
    command -v "$tool" >/dev/null || { say "missing: $tool"; exit 1; }
done
[ "$(id -u)" = 0 ] || { say "needs root (network namespaces)"; exit 1; }
if ip netns list | grep -qw gr-wan; then
    say "the namespaces of link.sh exist already: another benchmark is running"
    exit 1
fi
if [ ! -x "$BIN" ]; then
    say "building the release binary"
    (cd "$ROOT" && nice cargo build --release --locked --quiet)
fi

W=$(mktemp -d "$BASE/gem-office.XXXXXX")
REG_PID=
NGINX_PID=
cleanup() {
    [ -z "$REG_PID" ] || kill "$REG_PID" 2>/dev/null || true
    [ -z "$NGINX_PID" ] || kill "$NGINX_PID" 2>/dev/null || true
    "$LINK_SH" down >/dev/null 2>&1 || true
    [ -z "${ALLOWED_CC:-}" ] || sysctl -qw net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC" || true
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$W/www" "$W/nginx" "$W/registry" "$W/runs"
chmod 755 "$W" "$W/www"

# --- the link, in CUBIC on both ends (a namespace inherits the host's) ------
# shellcheck disable=SC2086
"$LINK_SH" up $LINK >&2
modprobe tcp_cubic 2>/dev/null || true
# A namespace may only pick an algorithm the host allows: cubic is added
# while the run lasts.
ALLOWED_CC=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
case " $ALLOWED_CC " in
    *" cubic "*) ;;
    *) sysctl -qw net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC cubic" ;;
esac
for n in gr-srv gr-cli; do ip netns exec "$n" sysctl -qw net.ipv4.tcp_congestion_control=cubic; done
ip -n gr-cli link set lo up

# --- throwaway certificate for the origin and the registry --------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=$HOST" \
    -addext "subjectAltName=DNS:$HOST,DNS:$REG,IP:$SRV_IP,IP:$CLI_IP" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -keyout "$W/nginx/key.pem" -out "$W/nginx/cert.pem" 2>/dev/null
CERT=$W/nginx/cert.pem
chmod 644 "$W/nginx/key.pem"

# --- the file and the origin ----------------------------------------------------
head -c $((MIB << 20)) /dev/urandom >"$W/www/f.bin"
SHA=$(sha256sum "$W/www/f.bin" | cut -d' ' -f1)
SIZE=$(stat -c %s "$W/www/f.bin")
LOG=$W/nginx/access.log
user_line=
[ "$(id -u)" = 0 ] && user_line="user $(id -un) $(id -gn);"
cat >"$W/nginx/nginx.conf" <<EOF
$user_line
worker_processes auto;
pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log warn;
events { worker_connections 1024; }
http {
    log_format counted '\$bytes_sent \$status';
    access_log $LOG counted;
    sendfile on;
    keepalive_requests 100000;
    default_type application/octet-stream;
    client_body_temp_path $W/nginx/body;
    proxy_temp_path $W/nginx/proxy;
    fastcgi_temp_path $W/nginx/fastcgi;
    uwsgi_temp_path $W/nginx/uwsgi;
    scgi_temp_path $W/nginx/scgi;
    ssl_protocols TLSv1.3;
    ssl_certificate $CERT;
    ssl_certificate_key $W/nginx/key.pem;
    server {
        listen $SRV_IP:$PORT ssl;
        server_name $HOST;
        root $W/www;
    }
}
EOF
ip netns exec gr-srv "$NGINX" -p "$W/nginx" -c "$W/nginx/nginx.conf" -e "$W/nginx/error.log"
for _ in $(seq 50); do [ -s "$W/nginx/nginx.pid" ] && break; sleep 0.1; done
NGINX_PID=$(cat "$W/nginx/nginx.pid")
: >"$LOG"

# --- the registry, near the stores ---------------------------------------------
cat >"$W/registry/config.yml" <<EOF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $W/registry/data
http:
  addr: $CLI_IP:$REG_PORT
  tls:
    certificate: $CERT
    key: $W/nginx/key.pem
EOF
"${IN_CLI[@]}" /usr/bin/docker-registry serve "$W/registry/config.yml" >"$W/registry/log" 2>&1 &
REG_PID=$!
for _ in $(seq 100); do
    "${IN_CLI[@]}" bash -c "exec 3<>/dev/tcp/$CLI_IP/$REG_PORT" 2>/dev/null && break
    sleep 0.1
done

printf '{"id":"office","name":"office","version":"1.0.0","description":"office","resources":[{"id":"f","url":"https://%s:%s/f.bin","sha256":"%s","size":%s,"required":true}]}\n' \
    "$HOST" "$PORT" "$SHA" "$SIZE" >"$W/m.json"

# The configuration of one store; $1: the [cache] repository, or "" for none.
config() {
    local out=$1 repo=$2
    {
        if [ -n "$repo" ]; then
            printf '[cache]\noci = "https://%s:%s/%s"\nallow_internal = true\npush = true\n' "$REG" "$REG_PORT" "$repo"
        fi
        printf '[dev]\nextra_root_certs = ["%s"]\nresolve = { "%s" = ["%s"], "%s" = ["%s"] }\nallow_addresses = ["10.88.0.0/24"]\n' \
            "$CERT" "$HOST" "$SRV_IP" "$REG" "$CLI_IP"
    } >"$out"
}

origin_bytes() { awk '{ s += $1 } END { print s + 0 }' "$LOG"; }
now() { date +%s%N; }

# Runs N stores' fetches at once (stores i..N of run dir $1); fails when one
# did.
fetch_all() { # dir first last
    local d=$1 pids=() i rc=0
    for i in $(seq "$2" "$3"); do
        "${IN_CLI[@]}" "$BIN" --config "$d/c$i.toml" --store "$d/s$i" fetch "$W/m.json" \
            >"$d/out$i" 2>"$d/err$i" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

RESULTS=()
RUN=0
one() { # mode N
    local mode=$1 n=$2 d t0 t1= i repo= ok=ok
    RUN=$((RUN + 1))
    d=$W/runs/$RUN
    mkdir -p "$d"
    case $mode in cache | together) repo="office/run$RUN" ;; esac
    for i in $(seq "$n"); do config "$d/c$i.toml" "$repo"; done
    : >"$LOG"
    sync
    t0=$(now)
    case $mode in
        nocache | together) fetch_all "$d" 1 "$n" || ok=FAILED ;;
        cache)
            # The first desktop's file is verified before it seeds the
            # registry: with N = 1 the seeding is not timed.
            fetch_all "$d" 1 1 || ok=FAILED
            [ "$n" -gt 1 ] || t1=$(now)
            "${IN_CLI[@]}" "$BIN" --config "$d/c1.toml" --store "$d/s1" cache push >"$d/push" 2>&1 || ok=FAILED
            [ "$n" -lt 2 ] || fetch_all "$d" 2 "$n" || ok=FAILED
            ;;
        aria2c)
            local pids=()
            for i in $(seq "$n"); do
                "${IN_CLI[@]}" aria2c -q -x8 -s8 -k1M --ca-certificate="$CERT" \
                    --file-allocation=none --allow-overwrite=true -d "$d/a$i" -o f.bin \
                    --checksum="sha-256=$SHA" "https://$SRV_IP:$PORT/f.bin" >"$d/out$i" 2>&1 &
                pids+=($!)
            done
            for p in "${pids[@]}"; do wait "$p" || ok=FAILED; done
            ;;
    esac
    [ "$mode" = cache ] && [ "$n" = 1 ] || t1=$(now)
    sleep 0.5
    local bytes secs
    bytes=$(origin_bytes)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
    RESULTS+=("$(printf '| %s | %s | %s MiB (%.2f x the file) | %s s | %s |' "$mode" "$n" \
        "$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')" \
        "$(awk -v b="$bytes" -v s="$SIZE" 'BEGIN { print b / s }')" "$secs" "$ok")")
    say "${RESULTS[-1]}"
    rm -rf "$d"
}

say "office: a ${MIB} MiB file, link: $LINK (link.sh up), N = $NS, modes: $MODES"
for n in $NS; do
    for mode in $MODES; do one "$mode" "$n"; done
done

printf '\n| mode | N | bytes from the origin | time to the last verified file | |\n|---|---|---|---|---|\n'
printf '%s\n' "${RESULTS[@]}"
