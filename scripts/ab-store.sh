#!/usr/bin/env bash
# Interleaved A/B of builds where the store is the work: `fetch` or `install`
# of one manifest, each run into a new store, the builds' order reversed
# every other round, wall and CPU time of each run (`/usr/bin/time`).
#
#   scripts/ab-store.sh RUNS fetch|install CONFIG MANIFEST BIN...
#
# CONFIG is a gem-resources config that reaches the manifest's origin (its
# [dev] section for a local one, as scripts/bench.sh writes); MANIFEST a
# manifest with many small files (installed under its own gem id).
#
#   AB_FS=fresh (default)  every run on an ext4 made anew (a 2 GiB image,
#                          mkfs.ext4, a loop mount: needs root): no run pays
#                          for files an earlier one made or deleted
#   AB_FS=DIR              every run in a new folder under DIR, moved aside
#                          afterwards (deleted at exit: deleting thousands of
#                          files slows the next creations on some file systems)
#   AB_LOG=FILE            also append each run's line there
#
# Prints one line per run (build, command, wall s, user s, sys s) and then
# each build's means. Compare builds of one invocation only.
set -euo pipefail

if [ $# -lt 5 ]; then
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
runs=$1 cmd=$2 config=$3 manifest=$4
shift 4
case $cmd in
  fetch) args=(fetch "$manifest") ;;
  install)
    gem=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$manifest")
    args=(install "$gem" "$manifest") ;;
  *) echo "ab-store: the command is fetch or install, not $cmd" >&2; exit 2 ;;
esac
for bin in "$@"; do
  [ -x "$bin" ] || { echo "ab-store: $bin is not an executable" >&2; exit 2; }
done

fs=${AB_FS:-fresh}
work=$(mktemp -d "${TMPDIR:-/tmp}/ab-store.XXXXXX")
log=$work/runs.txt
mnt=$work/mnt
cleanup() {
  if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || true; fi
  rm -rf "$work"
  if [ "$fs" != fresh ] && [ -n "${aside:-}" ]; then rm -rf "$aside"; fi
}
trap cleanup EXIT
if [ "$fs" = fresh ]; then
  command -v mkfs.ext4 >/dev/null || { echo "ab-store: AB_FS=fresh needs mkfs.ext4" >&2; exit 2; }
  mkdir -p "$mnt"
else
  aside=$(mktemp -d "$fs/ab-store-aside.XXXXXX")
fi

# Where the next run's store goes, made ready.
next_store() {
  local n=$1
  if [ "$fs" = fresh ]; then
    if mountpoint -q "$mnt"; then umount "$mnt"; fi
    rm -f "$work/fs.img"
    truncate -s 2G "$work/fs.img"
    mkfs.ext4 -q -F "$work/fs.img"
    mount -o loop "$work/fs.img" "$mnt"
    echo "$mnt/store"
  else
    echo "$fs/ab-store-run-$$-$n"
  fi
}

bins=("$@")
n=0
for round in $(seq "$runs"); do
  order=("${bins[@]}")
  if [ $((round % 2)) = 0 ]; then
    order=()
    for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[$i]}"); done
  fi
  for bin in "${order[@]}"; do
    n=$((n + 1))
    store=$(next_store "$n")
    sync
    /usr/bin/time -a -o "$log" -f "$bin $cmd %e %U %S" \
      "$bin" --config "$config" --store "$store" "${args[@]}" >/dev/null 2>"$work/stderr" \
      || { echo "ab-store: $bin failed:" >&2; tail -5 "$work/stderr" >&2; exit 1; }
    if [ "$fs" != fresh ]; then mv "$store" "$aside/"; fi
  done
done

cat "$log"
if [ -n "${AB_LOG:-}" ]; then cat "$log" >>"$AB_LOG"; fi
awk '{k=$1; w[k]+=$3; u[k]+=$4; s[k]+=$5; c[k]++}
  END {for (k in w) printf "%s: %d runs, wall %.3f s, CPU %.2f user + %.2f sys\n", k, c[k], w[k]/c[k], u[k]/c[k], s[k]/c[k]}' "$log"
