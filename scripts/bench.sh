#!/usr/bin/env bash
# Speed benchmark: gem-resources against the tools people would use instead,
# on one nginx HTTPS origin (TLS 1.3, HTTP/1.1) on loopback, in the same run.
#
#   scripts/bench.sh                         # full run (about 10 minutes)
#   BENCH_RUNS=1 BENCH_BIG_MIB=256 scripts/bench.sh      # quick look
#   BENCH_CASES="tiny" BENCH_TINY=500 scripts/bench.sh   # one case
#
# Knobs (environment):
#   BENCH_RUNS=5          runs per tool and case (median reported); runs are
#                         interleaved: run 1 of every tool, then run 2, ...
#   BENCH_CASES="big mid many tiny"   (also: api, capped)
#   BENCH_API_CALLS=2000 BENCH_API_SUBSCRIBERS=1000 BENCH_API_MIB=256
#                         the "api" case (js/bench/api.mjs; needs Node)
#   BENCH_BIG_MIB=1024    size of the "big" file
#   BENCH_MID_MIB=64      size of the "mid" file
#   BENCH_MANY=200 BENCH_MANY_KIB=1024     the many-files case
#   BENCH_TINY=2000 BENCH_TINY_BYTES=256   the thousands-of-resources case
#   BENCH_CAPPED_MIB=64   the "capped" case: one file on three more nginx
#                         ports (url and two mirrors) whose every connection
#                         is limited to BENCH_CAP (limit_rate, default 4m),
#                         as CDNs do; not in the default cases
#   BENCH_SLOW_MIB=16     the "slowconn" case: one file from a port where
#                         every fifth connection is capped at 32 KiB/s and
#                         the others at BENCH_CAP (one slow connection among
#                         fast ones); not in the default cases
#   BENCH_LINKS="far home wifi"   emulated links (none by default): each brings
#                         up ../shared/tools/wanemu/link.sh (BENCH_LINK_SH),
#                         runs a second nginx in the namespace gr-srv
#                         (10.88.0.1) and every tool in gr-cli, on 16 MiB,
#                         64 MiB and 100 x 256 KiB; needs root
#                         far:  RTT 160 ms, loss 0.5 %, 100 Mbit/s
#                         farbbr: the same, the server's TCP on BBR
#                         home: RTT 40 ms, loss 0.1 %, 50 Mbit/s
#                         wifi: RTT 80 +- 10 ms, loss 2 %, 30 Mbit/s
#                         Both namespaces use CUBIC (farbbr: BBR) whatever
#                         the machine's default: a namespace inherits the
#                         host's, and on BBR loss barely slows a connection.
#                         The host's tcp_allowed_congestion_control gains
#                         the one needed while the run lasts.
#   BENCH_LINK_FILES="l16 l64 lmany"   which of those three each link runs
#   BENCH_LINK_ONE=no     leaves out the one-connection rows of a link (curl,
#                         aria2c -x1: minutes per run on the lossy links)
#   BENCH_DIR=/var/tmp    where the origin's files and every store go (the
#                         file system measured; not a tmpfs unless you mean it)
#   BENCH_BIN=target/release/gem-resources   (built when missing)
#   BENCH_LOG_DIR=DIR     keep every run's stderr there, ours at
#                         RUST_LOG=gem_resources=debug, and over a link
#                         nginx's lines for the run (connection, status,
#                         bytes, end, seconds, range): what to read before
#                         changing code for speed
#   BENCH_BEFORE=path/to/an/older/gem-resources   an A/B: that binary gets a
#                         row of its own (same configuration, interleaved)
#                         in the one-file, capped and many-files cases and
#                         over every link
#
# Installs what it needs from Debian when missing (nginx-light, aria2, curl,
# time, openssl). Not part of CI. Touches nothing outside its temporary
# folder; nginx listens on 127.0.0.1 only and is stopped on exit (with
# BENCH_LINKS, a second one on 10.88.0.1 inside the namespace gr-srv, which
# exists only while its link is up: link.sh down removes it).
set -euo pipefail

RUNS=${BENCH_RUNS:-5}
CASES=${BENCH_CASES:-"big mid many tiny"}
BIG_MIB=${BENCH_BIG_MIB:-1024}
MID_MIB=${BENCH_MID_MIB:-64}
MANY=${BENCH_MANY:-200}
MANY_KIB=${BENCH_MANY_KIB:-1024}
TINY=${BENCH_TINY:-2000}
TINY_BYTES=${BENCH_TINY_BYTES:-256}
CAPPED_MIB=${BENCH_CAPPED_MIB:-64}
CAP=${BENCH_CAP:-4m}
SLOW_MIB=${BENCH_SLOW_MIB:-16}
LINKS=${BENCH_LINKS:-}
LINK_SH=${BENCH_LINK_SH:-$(cd "$(dirname "$0")/.." && pwd)/../shared/tools/wanemu/link.sh}
LINK_FILES=${BENCH_LINK_FILES:-"l16 l64 lmany"}
LINK_ONE=${BENCH_LINK_ONE:-yes}
LINK_PORT=8443
LINK_IP=10.88.0.1
BASE=${BENCH_DIR:-/var/tmp}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BENCH_BIN:-$ROOT/target/release/gem-resources}
HOST=bench.test

say() { printf '%s\n' "$*" >&2; }

# --- tools -----------------------------------------------------------------
need_install=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_install+=(nginx-light)
command -v aria2c >/dev/null || need_install+=(aria2)
command -v curl >/dev/null || need_install+=(curl)
command -v openssl >/dev/null || need_install+=(openssl)
[ -x /usr/bin/time ] || need_install+=(time)
if [ ${#need_install[@]} -gt 0 ]; then
    say "installing ${need_install[*]}"
    SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_install[@]}" >/dev/null; then
        # nginx-light is gone from newer Debian releases.
        need_install=("${need_install[@]/nginx-light/nginx}")
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_install[@]}" >/dev/null
    fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
if [ ! -x "$BIN" ]; then
    say "building the release binary"
    (cd "$ROOT" && cargo build --release --quiet)
fi

# --- the local API (case "api"): node js/bench/api.mjs ----------------------
# path of a present file over the API from Node against the CLI per call,
# one download with and without BENCH_API_SUBSCRIBERS subscribers, the
# idle service's memory. Its own origin (the JavaScript tests' fixture).
if [[ " $CASES " == *" api "* ]]; then
    say "the local API (js/bench/api.mjs)"
    GEM_RESOURCES_BIN=$BIN node "$ROOT/js/bench/api.mjs"
    CASES=${CASES/api/}
    [ -z "${CASES// /}" ] && exit 0
fi

# --- work folder, cleaned up on exit ---------------------------------------
W=$(mktemp -d "$BASE/gem-bench.XXXXXX")
chmod 755 "$W"
NGINX_PID=
LINK_NGINX_PID=
LINK_UP=
stop_pid() {
    if [ -n "$1" ] && kill -0 "$1" 2>/dev/null; then
        kill -QUIT "$1" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    fi
}
cleanup() {
    stop_pid "$NGINX_PID"
    stop_pid "$LINK_NGINX_PID"
    [ -z "$LINK_UP" ] || "$LINK_SH" down || true
    [ -z "$SAVED_ALLOWED_CC" ] ||
        sysctl -qw net.ipv4.tcp_allowed_congestion_control="$SAVED_ALLOWED_CC" || true
    rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$W/www" "$W/out" "$W/res" "$W/nginx"
chmod 755 "$W/www"

# --- throwaway certificate: self-signed, CA:TRUE, for bench.test and 127.0.0.1
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=$HOST" \
    -addext "subjectAltName=DNS:$HOST,IP:127.0.0.1,IP:$LINK_IP" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -keyout "$W/nginx/key.pem" -out "$W/nginx/cert.pem" 2>/dev/null
CERT=$W/nginx/cert.pem

# --- files ------------------------------------------------------------------
make_file() { # name bytes
    head -c "$2" /dev/urandom >"$W/www/$1"
}
has_case() { [[ " $CASES " == *" $1 "* ]]; }
say "generating files in $W/www"
has_case big && make_file big.bin $((BIG_MIB * 1048576))
has_case mid && make_file mid.bin $((MID_MIB * 1048576))
has_case capped && make_file capped.bin $((CAPPED_MIB * 1048576))
has_case slowconn && make_file slow.bin $((SLOW_MIB * 1048576))
if [ -n "$LINKS" ]; then
    make_file l16.bin $((16 * 1048576))
    make_file l64.bin $((64 * 1048576))
    mkdir -p "$W/www/lmany"
    for i in $(seq -w 1 100); do make_file "lmany/f$i.bin" $((256 * 1024)); done
fi
if has_case many; then
    mkdir -p "$W/www/many"
    for i in $(seq -w 1 "$MANY"); do make_file "many/f$i.bin" $((MANY_KIB * 1024)); done
fi
if has_case tiny; then
    mkdir -p "$W/www/tiny"
    # One stream of random bytes cut into pieces: fast for thousands.
    head -c $((TINY * TINY_BYTES)) /dev/urandom >"$W/tiny.all"
    split -a 5 -d -b "$TINY_BYTES" "$W/tiny.all" "$W/www/tiny/t"
    rm "$W/tiny.all"
    (cd "$W/www/tiny" && for f in t*; do mv "$f" "$f.bin"; done)
fi
# SHA-256 of every file, by its name under www/.
declare -A SHA
while read -r sum name; do SHA[$name]=$sum; done < <(cd "$W/www" && find . -name '*.bin' -printf '%P\0' | xargs -0 sha256sum)
chmod -R a+rX "$W/www"

# --- nginx on a free loopback port ------------------------------------------
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
start_nginx() {
    local user_line=
    [ "$(id -u)" = 0 ] && user_line="user $(id -un) $(id -gn);"
    cat >"$W/nginx/nginx.conf" <<EOF
$user_line
worker_processes auto;
pid $W/nginx/nginx.pid;
error_log $W/nginx/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    tcp_nopush on;
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
        listen 127.0.0.1:$PORT ssl;
        server_name $HOST;
        root $W/www;
    }
    server {
        listen 127.0.0.1:$PORT2 ssl http2;
        server_name $HOST;
        root $W/www;
    }
    # One slow connection among fast ones: every fifth connection (nginx
    # numbers them) at 32 KiB/s, the others at \$CAP.
    map \$connection \$one_in_five {
        ~[05]\$ 32k;
        default $CAP;
    }
    server {
        listen 127.0.0.1:$PORT6 ssl;
        server_name $HOST;
        root $W/www;
        limit_rate \$one_in_five;
    }
    server {
        listen 127.0.0.1:$PORT3 ssl;
        listen 127.0.0.1:$PORT4 ssl;
        listen 127.0.0.1:$PORT5 ssl;
        server_name $HOST;
        root $W/www;
        limit_rate $CAP;
    }
}
EOF
    "$NGINX" -p "$W/nginx" -c "$W/nginx/nginx.conf" -e "$W/nginx/error.log" 2>>"$W/nginx/start.log"
}
for _ in $(seq 20); do
    PORT=$((20000 + RANDOM % 40000)); PORT2=$((PORT + 1))
    PORT3=$((PORT + 2)); PORT4=$((PORT + 3)); PORT5=$((PORT + 4)); PORT6=$((PORT + 5))
    if port_free "$PORT" && port_free "$PORT2" && port_free "$PORT3" && port_free "$PORT4" \
        && port_free "$PORT5" && port_free "$PORT6" && start_nginx; then
        for _ in $(seq 50); do [ -s "$W/nginx/nginx.pid" ] && break; sleep 0.1; done
        NGINX_PID=$(cat "$W/nginx/nginx.pid")
        break
    fi
done
[ -n "$NGINX_PID" ] || { say "nginx did not start:"; cat "$W/nginx/start.log" >&2; exit 1; }
URL=https://$HOST:$PORT
URL6=https://$HOST:$PORT6
IPURL=https://127.0.0.1:$PORT
CURL=(curl -sSf --cacert "$CERT" --resolve "$HOST:$PORT:127.0.0.1" --resolve "$HOST:$PORT2:127.0.0.1"
    --resolve "$HOST:$PORT3:127.0.0.1" --resolve "$HOST:$PORT6:127.0.0.1" --http1.1)
"${CURL[@]}" -o /dev/null "$URL/" 2>/dev/null || true
say "nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') on 127.0.0.1:$PORT (HTTP/1.1) and :$PORT2 (HTTP/2), TLS 1.3"

# --- our configuration and manifests ----------------------------------------
cat >"$W/config.toml" <<EOF
[dev]
extra_root_certs = ["$CERT"]
resolve = { "$HOST" = ["127.0.0.1"] }
allow_addresses = ["127.0.0.1/32"]
EOF
manifest() { # out id-prefix required list-of-names...
    local out=$1 req=$2; shift 2
    {
        printf '{"id":"bench","name":"bench","version":"1.0.0","description":"bench","resources":[\n'
        local first=1 name
        for name in "$@"; do
            [ $first = 1 ] || printf ',\n'
            first=0
            printf '{"id":"%s","url":"%s/%s","sha256":"%s","size":%s,"required":%s}' \
                "$(basename "$name" .bin)" "$URL" "$name" "$(sha_of "$name")" \
                "$(stat -c %s "$W/www/$name")" "$req"
        done
        printf '\n]}\n'
    } >"$out"
}
sha_of() { echo "${SHA[$1]}"; }
names_of() { (cd "$W/www" && ls -1 "$1"/*.bin); }

# --- timing -----------------------------------------------------------------
# Every run appends "wall user sys rss_kib" to $W/t/<case>/<tool>.
mkdir -p "$W/t"
TOOLS_OF=()   # "case|tool" in display order
FAILS=0
LINK_LOG=$W/nginx/link-access.log
# The bytes the link carried from the server so far (its Ethernet frames):
# what a run really cost the link, unlike nginx's count, which includes
# what sat in a socket buffer when the tool closed the connection.
link_wire() {
    "$LINK_SH" stats >/dev/null 2>&1 || { echo 0; return; }
    awk '$1 == "a_to_b" { for (i = 2; i <= NF; i++) if ($i ~ /^bytes=/) { sub(/^bytes=/, "", $i); print $i } }' \
        "${STATE:-/var/tmp/gr-link}/stats"
}
LOG_DIR=${BENCH_LOG_DIR:-}
[ -z "$LOG_DIR" ] || { mkdir -p "$LOG_DIR"; export RUST_LOG=gem_resources=debug; }
timed() { # case tool command...
    local case=$1 tool=$2; shift 2
    local rec=$W/t/$case/${tool//\//_}
    mkdir -p "$W/t/$case"
    [ -e "$rec" ] || { : >"$rec"; TOOLS_OF+=("$case|$tool"); }
    local t0 t1 seen=0 wire0=
    [ ! -e "$LINK_LOG" ] || seen=$(wc -l <"$LINK_LOG")
    [[ $case != *-l* || -z $LINK_UP ]] || wire0=$(link_wire)
    t0=$(date +%s%N)
    if /usr/bin/time -f '%U %S %M' -o "$W/time.out" "$@" >"$W/cmd.out" 2>"$W/cmd.err"; then
        t1=$(date +%s%N)
        # A command that times its own work (scripts/layout-floor.py) prints
        # its seconds last: that figure, without the interpreter's start and
        # end.
        [ -z "${OWN_TIME:-}" ] ||
            t1=$((t0 + $(tail -1 "$W/cmd.out" | awk '{printf "%d", $1 * 1e9}')))
        read -r u s m <"$W/time.out"
        # Over a link: the connections and requests nginx saw for this run
        # (nginx writes a request's line when it ends).
        local conns=- reqs=- wire=-
        if [[ $case == *-l* && -e $LINK_LOG ]]; then
            sleep 0.3 # the lines of requests cut by the tool's exit
            read -r conns reqs < <(tail -n +$((seen + 1)) "$LINK_LOG" |
                awk '{c[$1] = 1; n++} END {print length(c), n + 0}')
        fi
        [ -z "$wire0" ] || wire=$(( $(link_wire) - wire0 ))
        echo "$(( (t1 - t0) / 1000 )) $u $s $m $conns $reqs $wire" >>"$rec"
        if [ -n "$LOG_DIR" ]; then
            local at=$LOG_DIR/$case.${tool//[^a-zA-Z0-9=._-]/_}.$(wc -l <"$rec")
            cp "$W/cmd.err" "$at.log"
            [ ! -e "$LINK_LOG" ] || tail -n +$((seen + 1)) "$LINK_LOG" >"$at.access"
        fi
    else
        say "  FAILED: $case / $tool"; sed 's/^/    /' "$W/cmd.err" | tail -5 >&2
        FAILS=$((FAILS + 1))
    fi
}
# Each run starts with an empty output folder and store: the last run's
# files are deleted. For the thousands of tiny files they are moved aside
# instead (deleted at exit): on ext4 without a journal (this machine's
# /var/tmp), creating files within a minute of deleting thousands is several
# times slower (the allocator skips recently deleted inodes), which would
# charge one tool for the cleanup of the run before it. Big files are
# deleted at once: kept, their dirty pages would be written back during the
# next runs.
TRASHED=0
# Then `sync`: the write-back of what the tool before left unflushed (curl
# and aria2c flush nothing) is charged to no tool, and neither is the
# deletion.
fresh() { rm -rf "$W/out" "$W/store"; mkdir -p "$W/out"; sync; }
fresh_aside() {
    mkdir -p "$W/trash"
    TRASHED=$((TRASHED + 1))
    [ ! -e "$W/out" ] || mv "$W/out" "$W/trash/out.$TRASHED"
    [ ! -e "$W/store" ] || mv "$W/store" "$W/trash/store.$TRASHED"
    mkdir -p "$W/out"
}
OURS=("$BIN" --config "$W/config.toml" --store "$W/store")
BEFORE=${BENCH_BEFORE:-}
BEFORE_ROW="gem-resources fetch, the build before (BENCH_BEFORE)"
OURSB=("$BEFORE" --config "$W/config.toml" --store "$W/store")
# The row of BENCH_BEFORE, when set: case manifest.
before_row() {
    [ -z "$BEFORE" ] || { fresh; timed "$1" "$BEFORE_ROW" "${OURSB[@]}" fetch "$2"; }
}
# The same with one connection per file (no ranged parts), and with six
# connections per host (the former default of max_per_host, now 8).
{ printf '[network]\nconnections_per_file = 1\n'; cat "$W/config.toml"; } >"$W/one.toml"
{ printf '[service]\nmax_per_host = 6\n'; cat "$W/config.toml"; } >"$W/six.toml"
OURS1=("$BIN" --config "$W/one.toml" --store "$W/store")
OURS6=("$BIN" --config "$W/six.toml" --store "$W/store")
{ printf '[network]\nspread_over_mirrors = true\n'; cat "$W/config.toml"; } >"$W/spread.toml"
OURSS=("$BIN" --config "$W/spread.toml" --store "$W/store")
{ printf '[network]\nconnections_per_file = 16\n[service]\nmax_per_host = 16\n'; cat "$W/config.toml"; } >"$W/sixteen.toml"
OURS16=("$BIN" --config "$W/sixteen.toml" --store "$W/store")
# Over an emulated link: the name resolves to the server's namespace.
sed "s#\"127.0.0.1\"\]#\"$LINK_IP\"]#; s#127.0.0.1/32#10.88.0.0/24#" "$W/config.toml" >"$W/link.toml"
{ printf '[network]\nconnections_per_file = 16\n[service]\nmax_per_host = 16\n'; cat "$W/link.toml"; } >"$W/link16.toml"
LOURS=("$BIN" --config "$W/link.toml" --store "$W/store")
LOURS16=("$BIN" --config "$W/link16.toml" --store "$W/store")
LOURSB=("$BEFORE" --config "$W/link.toml" --store "$W/store")

# --- one file ----------------------------------------------------------------
one_file_round() { # case file
    local c=$1 f=$2 sha
    sha=$(sha_of "$f")
    # Which build goes first alternates from run to run: the first one
    # may meet the disk still writing back what the round before wrote.
    if [ $((run % 2)) = 1 ]; then
        fresh; timed "$c" "gem-resources fetch" "${OURS[@]}" fetch "$W/res/$c.json"
        before_row "$c" "$W/res/$c.json"
    else
        before_row "$c" "$W/res/$c.json"
        fresh; timed "$c" "gem-resources fetch" "${OURS[@]}" fetch "$W/res/$c.json"
    fi
    fresh; timed "$c" "gem-resources fetch, connections_per_file = 1" "${OURS1[@]}" fetch "$W/res/$c.json"
    fresh; timed "$c" "curl | openssl dgst -sha256" bash -c \
        "set -o pipefail; \"\$@\" | openssl dgst -sha256 | grep -q $sha" _ "${CURL[@]}" "$URL/$f"
    fresh; timed "$c" "curl -o + openssl dgst" bash -c \
        "\"\$@\" -o $W/out/f && openssl dgst -sha256 $W/out/f | grep -q $sha" _ "${CURL[@]}" "$URL/$f"
    fresh; timed "$c" "curl -o + sha256sum" bash -c \
        "\"\$@\" -o $W/out/f && sha256sum $W/out/f | grep -q $sha" _ "${CURL[@]}" "$URL/$f"
    fresh; timed "$c" "curl -o + openssl dgst + sync" bash -c \
        "\"\$@\" -o $W/out/f && openssl dgst -sha256 $W/out/f | grep -q $sha && sync $W/out/f $W/out" \
        _ "${CURL[@]}" "$URL/$f"
    fresh; timed "$c" "aria2c -x1 --checksum" aria2c -q -x1 --ca-certificate="$CERT" \
        --file-allocation=none --allow-overwrite=true -d "$W/out" -o f \
        --checksum="sha-256=$sha" "$IPURL/$f"
    fresh; timed "$c" "curl -o /dev/null (no check)" "${CURL[@]}" -o /dev/null "$URL/$f"
}

# --- one file behind a per-connection cap, url and two mirrors --------------
capped_round() { # case file
    local c=$1 f=$2 sha
    sha=$(sha_of "$f")
    local u1=https://$HOST:$PORT3/$f i1=https://127.0.0.1:$PORT3/$f
    local i2=https://127.0.0.1:$PORT4/$f i3=https://127.0.0.1:$PORT5/$f
    fresh; timed "$c" "gem-resources fetch" "${OURS[@]}" fetch "$W/res/$c.json"
    before_row "$c" "$W/res/$c.json"
    fresh; timed "$c" "gem-resources fetch, max_per_host = 6" "${OURS6[@]}" fetch "$W/res/$c.json"
    fresh; timed "$c" "gem-resources fetch, spread_over_mirrors" "${OURSS[@]}" fetch "$W/res/$c.json"
    fresh; timed "$c" "gem-resources fetch, connections_per_file = 1" "${OURS1[@]}" fetch "$W/res/$c.json"
    fresh; timed "$c" "curl -o (one connection)" "${CURL[@]}" -o "$W/out/f" "$u1"
    fresh; timed "$c" "aria2c -x1 --checksum" aria2c -q -x1 --ca-certificate="$CERT" \
        --file-allocation=none --allow-overwrite=true -d "$W/out" -o f \
        --checksum="sha-256=$sha" "$i1"
    fresh; timed "$c" "aria2c -x8 -s8 -k1M --checksum" aria2c -q -x8 -s8 -k1M --ca-certificate="$CERT" \
        --file-allocation=none --allow-overwrite=true -d "$W/out" -o f \
        --checksum="sha-256=$sha" "$i1"
    fresh; timed "$c" "aria2c -s3 --checksum (url + 2 mirrors)" aria2c -q -s3 --ca-certificate="$CERT" \
        --file-allocation=none --allow-overwrite=true -d "$W/out" -o f \
        --checksum="sha-256=$sha" "$i1" "$i2" "$i3"
}

# --- one slow connection among fast ones ------------------------------------
slowconn_round() { # case file
    local c=$1 f=$2 sha
    sha=$(sha_of "$f")
    local i6=https://127.0.0.1:$PORT6/$f
    fresh; timed "$c" "gem-resources fetch" "${OURS[@]}" fetch "$W/res/$c.json"
    fresh; timed "$c" "gem-resources fetch, connections_per_file = 16" "${OURS16[@]}" fetch "$W/res/$c.json"
    fresh; timed "$c" "gem-resources fetch, every connection fast (reference)" "${OURS[@]}" fetch "$W/res/$c-fast.json"
    # No single-connection row: one in five of them would take minutes.
    for x in 8 16; do
        fresh; timed "$c" "aria2c -x$x -s$x -k1M --checksum" aria2c -q -x$x -s$x -k1M --ca-certificate="$CERT" \
            --file-allocation=none --allow-overwrite=true -d "$W/out" -o f \
            --checksum="sha-256=$sha" "$i6"
    done
}

# --- emulated links (link.sh): nginx in gr-srv, every tool in gr-cli ---------
IN_CLI=(ip netns exec gr-cli)
link_round() { # regime
    local r=$1 f sha c
    local lu=https://$HOST:$LINK_PORT li=https://$LINK_IP:$LINK_PORT
    local lcurl=("${IN_CLI[@]}" curl -sSf --cacert "$CERT" --resolve "$HOST:$LINK_PORT:$LINK_IP" --http1.1)
    for f in l16.bin l64.bin; do
        c=$r-${f%.bin}; sha=$(sha_of "$f")
        [[ " $LINK_FILES " == *" ${f%.bin} "* ]] || continue
        fresh; timed "$c" "gem-resources fetch" "${IN_CLI[@]}" "${LOURS[@]}" fetch "$W/res/$c.json"
        [ -z "$BEFORE" ] || { fresh; timed "$c" "$BEFORE_ROW" "${IN_CLI[@]}" "${LOURSB[@]}" fetch "$W/res/$c.json"; }
        fresh; timed "$c" "gem-resources fetch, connections_per_file = 16" "${IN_CLI[@]}" "${LOURS16[@]}" fetch "$W/res/$c.json"
        if [ "$LINK_ONE" != no ]; then
            fresh; timed "$c" "curl -o (one connection)" "${lcurl[@]}" -o "$W/out/f" "$lu/$f"
            fresh; timed "$c" "aria2c -x1 --checksum" "${IN_CLI[@]}" aria2c -q -x1 --ca-certificate="$CERT" \
                --file-allocation=none --allow-overwrite=true -d "$W/out" -o f --checksum="sha-256=$sha" "$li/$f"
        fi
        for x in 8 16; do
            fresh; timed "$c" "aria2c -x$x -s$x -k1M --checksum" "${IN_CLI[@]}" aria2c -q -x$x -s$x -k1M \
                --ca-certificate="$CERT" --file-allocation=none --allow-overwrite=true -d "$W/out" -o f \
                --checksum="sha-256=$sha" "$li/$f"
        done
    done
    c=$r-lmany
    [[ " $LINK_FILES " == *" lmany "* ]] || return 0
    fresh; timed "$c" "gem-resources fetch" "${IN_CLI[@]}" "${LOURS[@]}" fetch "$W/res/$c.json"
    [ -z "$BEFORE" ] || { fresh; timed "$c" "$BEFORE_ROW" "${IN_CLI[@]}" "${LOURSB[@]}" fetch "$W/res/$c.json"; }
    fresh; timed "$c" "curl -Z --parallel-max 8 (no check)" "${lcurl[@]}" -Z --parallel-max 8 -K "$W/res/lmany.curl"
    fresh; timed "$c" "aria2c -j8 --checksum" "${IN_CLI[@]}" aria2c -q -j8 -x1 --ca-certificate="$CERT" \
        --file-allocation=none --allow-overwrite=true -d "$W/out" -i "$W/res/lmany.aria2"
}
link_params() { # regime -> DELAY_MS JITTER_MS LOSS_PCT RATE_MBIT
    case $1 in
        far | farbbr) echo "80 0 0.5 100" ;;
        home) echo "20 0 0.1 50" ;;
        wifi) echo "40 10 2 30" ;;
        *) return 1 ;;
    esac
}
link_cc() { # regime -> the TCP congestion control of both ends
    case $1 in
        farbbr) echo bbr ;;
        *) echo cubic ;;
    esac
}
SAVED_ALLOWED_CC=
set_link_cc() { # congestion control, in gr-srv and gr-cli
    local cc=$1 allowed
    allowed=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
    [ -n "$SAVED_ALLOWED_CC" ] || SAVED_ALLOWED_CC=$allowed
    modprobe "tcp_$cc" 2>/dev/null || true
    # A namespace may only pick an algorithm the host allows.
    case " $allowed " in
        *" $cc "*) ;;
        *) sysctl -qw net.ipv4.tcp_allowed_congestion_control="$allowed $cc" ;;
    esac
    local n
    for n in gr-srv gr-cli; do ip netns exec "$n" sysctl -qw net.ipv4.tcp_congestion_control="$cc"; done
    say "link: TCP congestion control $cc on both ends"
}
start_link_nginx() {
    local user_line=
    [ "$(id -u)" = 0 ] && user_line="user $(id -un) $(id -gn);"
    cat >"$W/nginx/link.conf" <<EOF
$user_line
worker_processes auto;
pid $W/nginx/link.pid;
error_log $W/nginx/link-error.log warn;
events { worker_connections 1024; }
http {
    # One line per request: the report counts each run's connections and
    # requests from it.
    log_format counted '\$connection \$status \$bytes_sent \$msec \$request_time "\$http_range"';
    access_log $LINK_LOG counted;
    sendfile on;
    tcp_nopush on;
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
        listen $LINK_IP:$LINK_PORT ssl;
        server_name $HOST;
        root $W/www;
    }
}
EOF
    rm -f "$W/nginx/link.pid"
    ip netns exec gr-srv "$NGINX" -p "$W/nginx" -c "$W/nginx/link.conf" -e "$W/nginx/link-error.log"
    for _ in $(seq 50); do [ -s "$W/nginx/link.pid" ] && break; sleep 0.1; done
    LINK_NGINX_PID=$(cat "$W/nginx/link.pid")
}

# --- many files --------------------------------------------------------------
# The builds' rows of many_files_round (its locals c, d and fresh).
fetch_ours() { $fresh; timed "$c" "gem-resources fetch" "${OURS[@]}" fetch "$W/res/$c.json"; }
fetch_before() {
    [ -z "$BEFORE" ] || { $fresh; timed "$c" "$BEFORE_ROW" "${OURSB[@]}" fetch "$W/res/$c.json"; }
}
install_ours() {
    $fresh
    timed "$c" "gem-resources install" "${OURS[@]}" install bench "$W/res/$c.json"
    timed "$c" "gem-resources sync (all present)" "${OURS[@]}" sync
    timed "$c" "gem-resources status --json" "${OURS[@]}" --json status
    timed "$c" "gem-resources path" "${OURS[@]}" path bench "$(names_of "$d" | tail -1 | sed 's/.*\///; s/\.bin$//')"
    # Uninstalled after every run (it deletes thousands of files).
    mv "$W/store" "$W/installed/store.$run"
}
install_before() {
    [ -n "$BEFORE" ] || return 0
    $fresh
    timed "$c" "gem-resources install, the build before" "${OURSB[@]}" install bench "$W/res/$c.json"
    mv "$W/store" "$W/installed/store-before.$run"
}
FLOOR_STORE="file system only: the store's layout (scripts/layout-floor.py store)"
FLOOR_FLAT="file system only: one folder of names (scripts/layout-floor.py flat)"
many_files_round() { # case dir
    local c=$1 d=$2 fresh=fresh
    [ "$c" != tiny ] || fresh=fresh_aside
    # Which build goes first alternates from run to run: the first one
    # after the previous round's deletions pays for them (see fresh_aside).
    local first=ours second=before
    [ $((run % 2)) = 1 ] || { first=before; second=ours; }
    "fetch_$first"; "fetch_$second"
    if [ "$c" = tiny ]; then
        mkdir -p "$W/installed"
        "install_$first"; "install_$second"
    fi
    if command -v python3 >/dev/null; then
        # The file system's own cost of the same files, without the
        # program: the store's layout, and one folder of names.
        local n=$TINY bytes=$TINY_BYTES
        [ "$c" = tiny ] || { n=$MANY; bytes=$((MANY_KIB * 1024)); }
        $fresh; OWN_TIME=1 timed "$c" "$FLOOR_STORE" python3 "$ROOT/scripts/layout-floor.py" "$W/out/f" store "$n" "$bytes"
        $fresh; OWN_TIME=1 timed "$c" "$FLOOR_FLAT" python3 "$ROOT/scripts/layout-floor.py" "$W/out/f" flat "$n" "$bytes"
    fi
    $fresh; timed "$c" "curl -Z --parallel-max 8 (no check)" "${CURL[@]}" -Z --parallel-max 8 -K "$W/res/$c.curl"
    $fresh; timed "$c" "curl -Z --parallel-max 8 + sha256sum -c" bash -c \
        "\"\$@\" -Z --parallel-max 8 -K $W/res/$c.curl && cd $W/out && sha256sum -c --quiet $W/res/$c.sums" \
        _ "${CURL[@]}"
    $fresh; timed "$c" "curl -Z --parallel-max 8 --http2 (no check)" "${CURL[@]/--http1.1/--http2}" \
        -Z --parallel-max 8 -K "$W/res/$c.curl2"
    $fresh; timed "$c" "aria2c -j8 --checksum" aria2c -q -j8 -x1 --ca-certificate="$CERT" \
        --file-allocation=none --allow-overwrite=true -d "$W/out" -i "$W/res/$c.aria2"
}
many_inputs() { # case dir
    local c=$1 d=$2 n sha
    : >"$W/res/$c.curl"; : >"$W/res/$c.curl2"; : >"$W/res/$c.aria2"; : >"$W/res/$c.sums"
    for n in $(names_of "$d"); do
        sha=$(sha_of "$n")
        printf 'url = "%s/%s"\noutput = "%s/out/%s"\n' "$URL" "$n" "$W" "${n#*/}" >>"$W/res/$c.curl"
        printf 'url = "https://%s:%s/%s"\noutput = "%s/out/%s"\n' "$HOST" "$PORT2" "$n" "$W" "${n#*/}" >>"$W/res/$c.curl2"
        printf '%s/%s\n  out=%s\n  checksum=sha-256=%s\n' "$IPURL" "$n" "${n#*/}" "$sha" >>"$W/res/$c.aria2"
        printf '%s  %s\n' "$sha" "${n#*/}" >>"$W/res/$c.sums"
    done
}

has_case big && manifest "$W/res/big.json" true big.bin
has_case mid && manifest "$W/res/mid.json" true mid.bin
if has_case capped; then
    # url and two mirrors on the capped ports.
    manifest "$W/res/capped.json" true capped.bin
    sed -i "s#\"url\":\"$URL/capped.bin\"#\"url\":\"https://$HOST:$PORT3/capped.bin\",\"mirrors\":[\"https://$HOST:$PORT4/capped.bin\",\"https://$HOST:$PORT5/capped.bin\"]#" \
        "$W/res/capped.json"
fi
if has_case slowconn; then
    manifest "$W/res/slowconn.json" true slow.bin
    sed "s#$URL/#https://$HOST:$PORT3/#" "$W/res/slowconn.json" >"$W/res/slowconn-fast.json"
    sed -i "s#$URL/#$URL6/#" "$W/res/slowconn.json"
fi
for r in $LINKS; do
    link_params "$r" >/dev/null || { say "unknown link regime: $r"; exit 2; }
    for f in l16 l64; do
        manifest "$W/res/$r-$f.json" true $f.bin
        sed -i "s#$URL/#https://$HOST:$LINK_PORT/#" "$W/res/$r-$f.json"
    done
    # shellcheck disable=SC2046
    manifest "$W/res/$r-lmany.json" true $(names_of lmany)
    sed -i "s#$URL/#https://$HOST:$LINK_PORT/#g" "$W/res/$r-lmany.json"
done
if [ -n "$LINKS" ]; then
    : >"$W/res/lmany.curl"; : >"$W/res/lmany.aria2"
    for n in $(names_of lmany); do
        printf 'url = "https://%s:%s/%s"\noutput = "%s/out/%s"\n' "$HOST" "$LINK_PORT" "$n" "$W" "${n#*/}" >>"$W/res/lmany.curl"
        printf 'https://%s:%s/%s\n  out=%s\n  checksum=sha-256=%s\n' "$LINK_IP" "$LINK_PORT" "$n" "${n#*/}" "$(sha_of "$n")" >>"$W/res/lmany.aria2"
    done
fi
# shellcheck disable=SC2046
has_case many && { manifest "$W/res/many.json" true $(names_of many); many_inputs many many; }
# shellcheck disable=SC2046
has_case tiny && { manifest "$W/res/tiny.json" true $(names_of tiny); many_inputs tiny tiny; }
# The same manifest against a port nobody listens on, without retries.
has_case tiny && sed "s#$URL/#https://$HOST:1/#g" "$W/res/tiny.json" >"$W/res/tiny-refused.json"
{ printf '[network]\nretries = 0\n'; cat "$W/config.toml"; } >"$W/refused.toml"

for run in $(seq "$RUNS"); do
    say "run $run/$RUNS"
    has_case big && one_file_round big big.bin
    has_case mid && one_file_round mid mid.bin
    has_case capped && capped_round capped capped.bin
    has_case slowconn && slowconn_round slowconn slow.bin
    # The tiny files before the many: the many-files round deletes each
    # tool's files, which would slow the creation of the next thousands.
    has_case tiny && many_files_round tiny tiny
    has_case many && many_files_round many many
done
if has_case tiny; then
    # What deletes thousands of files comes last, after every other run:
    # every download refused (each creates and removes its partial file),
    # then the uninstall of each run's installed store.
    say "refused downloads, uninstall"
    for run in $(seq "$RUNS"); do
        fresh_aside
        timed tiny "gem-resources install, all refused" "${OURS[@]/$W\/config.toml/$W/refused.toml}" \
            install bench "$W/res/tiny-refused.json"
        timed tiny "gem-resources status --json, all refused" "${OURS[@]/$W\/config.toml/$W/refused.toml}" --json status
        if [ -n "$BEFORE" ]; then
            fresh_aside
            timed tiny "gem-resources install, all refused, the build before" \
                "${OURSB[@]/$W\/config.toml/$W/refused.toml}" install bench "$W/res/tiny-refused.json"
        fi
    done
    for run in $(seq "$RUNS"); do
        timed tiny "gem-resources uninstall" "${OURS[@]/#$W\/store/$W/installed/store.$run}" uninstall bench
        [ -z "$BEFORE" ] || timed tiny "gem-resources uninstall, the build before" \
            "${OURSB[@]/#$W\/store/$W/installed/store-before.$run}" uninstall bench
    done
fi
fresh
# Each link regime in turn, its runs interleaved like the others'.
for r in $LINKS; do
    # shellcheck disable=SC2046
    "$LINK_SH" up $(link_params "$r") >&2
    LINK_UP=1
    set_link_cc "$(link_cc "$r")"
    start_link_nginx
    for run in $(seq "$RUNS"); do
        say "link $r: run $run/$RUNS"
        link_round "$r"
    done
    "$LINK_SH" stats >&2 || true
    # The namespaces go with the link: the next regime starts its own nginx.
    stop_pid "$LINK_NGINX_PID"; LINK_NGINX_PID=
    "$LINK_SH" down; LINK_UP=
done
fresh

# --- report ------------------------------------------------------------------
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
col() { awk -v c="$1" '{print $c}' "$2"; }
bytes_of() {
    case $1 in
        big) echo $((BIG_MIB * 1048576)) ;;
        mid) echo $((MID_MIB * 1048576)) ;;
        capped) echo $((CAPPED_MIB * 1048576)) ;;
        slowconn) echo $((SLOW_MIB * 1048576)) ;;
        *-l16) echo $((16 * 1048576)) ;;
        *-l64) echo $((64 * 1048576)) ;;
        *-lmany) echo $((100 * 256 * 1024)) ;;
        many) echo $((MANY * MANY_KIB * 1024)) ;;
        tiny) echo $((TINY * TINY_BYTES)) ;;
    esac
}
label_of() {
    case $1 in
        big) echo "$BIG_MIB MiB, one file" ;;
        mid) echo "$MID_MIB MiB, one file" ;;
        capped) echo "$CAPPED_MIB MiB, one file, every connection capped at $CAP/s (limit_rate), url + 2 mirrors" ;;
        slowconn) echo "$SLOW_MIB MiB, one file, every fifth connection at 32 KiB/s, the others at $CAP/s" ;;
        *-l16 | *-l64 | *-lmany)
            local r=${1%-*} what d j l m
            case $1 in *-l16) what="16 MiB, one file" ;; *-l64) what="64 MiB, one file" ;; *) what="100 × 256 KiB" ;; esac
            read -r d j l m < <(link_params "$r")
            echo "$what, link $r: RTT $((2 * d)) ms ± $j ms, loss $l % per direction, $m Mbit/s, TCP $(link_cc "$r")" ;;
        many) echo "$MANY × $MANY_KIB KiB in one manifest" ;;
        tiny) echo "$TINY × $TINY_BYTES B in one manifest" ;;
    esac
}
FS=$(df -T "$BASE" | awk 'NR==2 {print $2}')
# An ext4 without a journal passes over recently freed inodes as it makes
# new ones: the many-files cases then pay for the files deleted before them.
if [ "$FS" = ext4 ]; then
    dev=$(df "$BASE" | awk 'NR==2 {print $1}')
    dev=$(basename "$(readlink -f "$dev")")
    if [ -d /proc/fs/ext4/"$dev" ]; then
        if ls -d /proc/fs/jbd2/"$dev"-* >/dev/null 2>&1; then FS="ext4 (journaled)"; else FS="ext4 without a journal"; fi
    fi
fi
CPU=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo
echo "Commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with local changes)')"
echo "Machine: $(nproc) CPUs, $CPU, Linux $(uname -r), store on $FS ($BASE)"
echo "Origin: nginx, TLS 1.3, HTTP/1.1 on loopback (HTTP/2 only where the tool says --http2);"
echo "over a link: on $LINK_IP in the namespace gr-srv, every tool in gr-cli."
[ -z "$BEFORE" ] || echo "The build before: $BEFORE."
echo "Median of $RUNS runs, interleaved. Wall time; MB/s = 10^6 bytes per second;"
echo "ratio = the tool's time / gem-resources' time (above 1: gem-resources is faster);"
echo "user, sys = CPU seconds; RSS = peak resident set of the largest process."
echo "Fairness: gem-resources fsyncs every file and its folder before publishing;"
echo "curl and aria2c do not fsync (except the '+ sync' row), and 'no check' rows verify nothing."
{ has_case tiny || has_case many; } && echo "'file system only' rows: scripts/layout-floor.py, the same files' file-system work from memory, without the program (its own figure, without Python's start)."
LINK_CASES=
for r in $LINKS; do for f in $LINK_FILES; do LINK_CASES="$LINK_CASES $r-$f"; done; done
for c in big mid capped slowconn many tiny $LINK_CASES; do
    has_case "$c" || [[ " $LINK_CASES " == *" $c "* ]] || continue
    ref=$W/t/$c/"gem-resources fetch"
    ours=$( [ -s "$ref" ] && col 1 "$ref" | median || echo nan)
    echo
    echo "### $(label_of "$c")"
    echo
    link=; [[ " $LINK_CASES " == *" $c "* ]] && link=1
    if [ -n "$link" ]; then
        echo "| tool | seconds | MB/s | ratio to gem-resources fetch | connections | requests | link bytes / file | user s | sys s | RSS MiB |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    else
        echo "| tool | seconds | MB/s | ratio to gem-resources fetch | user s | sys s | RSS MiB |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
    fi
    for entry in "${TOOLS_OF[@]}"; do
        [ "${entry%%|*}" = "$c" ] || continue
        tool=${entry#*|}; rec=$W/t/$c/${tool//\//_}
        if [ ! -s "$rec" ]; then echo "| $tool | failed | | | | | |"; continue; fi
        us=$(col 1 "$rec" | median)
        user=$(col 2 "$rec" | median)
        sys=$(col 3 "$rec" | median)
        rss=$(col 4 "$rec" | median)
        cr=
        [ -z "$link" ] ||
            cr="$(col 5 "$rec" | median) | $(col 6 "$rec" | median) | $(col 7 "$rec" | median |
                awk -v b="$(bytes_of "$c")" '{printf "%.2f", $1 / b}') | "
        awk -v t="$tool" -v us="$us" -v ours="$ours" -v b="$(bytes_of "$c")" -v user="$user" -v sys="$sys" -v rss="$rss" \
            -v cr="$cr" \
            'BEGIN {
                s = us / 1e6
                mbs = (t ~ /sync \(all|status|path|uninstall|refused/) ? "" : sprintf(b / s < 1e7 ? "%.2f" : "%.0f", b / s / 1e6)
                r = (ours == "nan" || (t ~ /^gem-resources/ && t !~ /BENCH_BEFORE/)) ? "" : sprintf("%.2f", us / ours)
                gsub(/\|/, "\\|", t)
                printf "| %s | %.3f | %s | %s | %s%.2f | %.2f | %.1f |\n", t, s, mbs, r, cr, user, sys, rss / 1024
            }'
    done
done
if [ "$FAILS" -gt 0 ]; then
    echo
    echo "$FAILS run(s) failed (see above); their times are left out."
    exit 1
fi
