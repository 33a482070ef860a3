#!/usr/bin/env python3
"""The file system's floor for storing many small files, without gem-resources.

Does only the file-system work of a fetch of N new files, with the bytes
already in memory (no network, no TLS), from 8 threads as 8 transfers
would, and prints the seconds it took. scripts/bench.sh times it beside
`gem-resources fetch` in its "tiny" case: the gap between the two is what
the program adds; the floor itself is what the layout costs on that disk.

    scripts/layout-floor.py DIR store [N] [BYTES]
    scripts/layout-floor.py DIR flat  [N] [BYTES]
    scripts/layout-floor.py DIR store-without:PARTS [N] [BYTES]

store: what the store does for each new file (docs/rules.md, "The store's folder"):
  - creates and locks `locks/<sha256>.<size>.lock` and writes who holds it;
  - creates and writes `tmp/<sha256>.<size>.partial`;
  - creates the folder `blobs/<sha256>/`;
  then, in groups of 64 (store::publish): flushes the group's files from
  32 threads, flushes `blobs/` once, writes each file's stamp
  (`stamps/<sha256>.json`), renames each file into its folder and flushes
  each folder, from 32 threads.
flat: one folder of names, as curl or aria2c leave them, made as durable:
  creates and writes `tmp/<name>`; in groups of 64, flushes the files from
  32 threads, renames them into `files/` and flushes that folder once.
store-without:PARTS: the store's work without some of its parts, PARTS
  a comma-separated list of
  - lock: no lock file;
  - stamp: no stamp;
  - folder: no folder per file: each file is renamed to
    `blobs/<sha256>-f.bin` and `blobs/` flushed once per group.
  What each part costs on a disk is the store's figure less this one.

DIR must be empty or missing; it is left behind (delete it when done).
"""

import fcntl
import hashlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

GROUP = 64
TRANSFERS = 8
FLUSH_THREADS = 32


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root, layout = sys.argv[1], sys.argv[2]
    without = set()
    if layout.startswith("store-without:"):
        without = set(layout.split(":", 1)[1].split(","))
        layout = "store"
    if layout not in ("store", "flat") or not without <= {"lock", "stamp", "folder"}:
        sys.exit(__doc__)
    lock_files = layout == "store" and "lock" not in without
    stamps = layout == "store" and "stamp" not in without
    folders = layout == "store" and "folder" not in without
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    for folder in ("locks", "tmp", "blobs", "stamps", "files"):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    # Each file's bytes differ (its number first, then a block they share):
    # the file system stores them all the same, and the process, timed
    # whole by scripts/bench.sh, spends no time making or hashing them.
    block = os.urandom(max(0, size - 8))
    bodies = [(i.to_bytes(8, "little")[:size], block) for i in range(n)]
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    holder = b'{"gem":null,"addresses":["https://example.test/a.bin"],"pid":1}'
    stamp = b'{"files":{"f.bin":{"len":256,"modified":[0,0],"mode":256,"identity":[0,0]}}}'
    path = lambda *parts: os.path.join(root, *parts)

    def sync_folder(folder):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def arrive(i):
        """One file's work before publication; returns its open files."""
        sha = shas[i]
        lock = None
        if lock_files:
            lock = os.open(path("locks", f"{sha}.{size}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(lock, holder)
        if layout == "store":
            name = path("tmp", f"{sha}.{size}.partial")
        else:
            name = path("tmp", f"f{i}.bin")
        data = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.writev(data, bodies[i])
        if folders:
            os.mkdir(path("blobs", sha), 0o700)
        return data, lock

    def publish(group, opened, flush):
        list(flush.map(lambda i: os.fsync(opened[i][0]), group))
        if layout == "store":
            if folders:
                sync_folder(path("blobs"))
            for i in group:
                sha = shas[i]
                if stamps:
                    with open(path("stamps", f"{sha}.json"), "wb") as f:
                        f.write(stamp)
                partial = path("tmp", f"{sha}.{size}.partial")
                if folders:
                    os.rename(partial, path("blobs", sha, "f.bin"))
                else:
                    os.rename(partial, path("blobs", f"{sha}-f.bin"))
            if folders:
                list(flush.map(lambda i: sync_folder(path("blobs", shas[i])), group))
            else:
                sync_folder(path("blobs"))
        else:
            for i in group:
                os.rename(path("tmp", f"f{i}.bin"), path("files", f"f{i}.bin"))
            sync_folder(path("files"))
        for i in group:
            data, lock = opened[i]
            os.close(data)
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)
                os.close(lock)

    start = time.monotonic()
    with ThreadPoolExecutor(TRANSFERS) as transfers, ThreadPoolExecutor(FLUSH_THREADS) as flush:
        opened = list(transfers.map(arrive, range(n)))
        for first in range(0, n, GROUP):
            publish(range(first, min(n, first + GROUP)), opened, flush)
    print(f"{time.monotonic() - start:.3f}")


if __name__ == "__main__":
    main()
