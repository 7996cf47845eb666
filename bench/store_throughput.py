"""Artifact-store throughput against the hardware bound measured in the same run.

The store hashes while it writes (temp file, fsync, rename) and re-hashes on every read. The
baseline is what those steps cost at minimum on this machine: one sha256 pass plus one plain
copy of the same bytes. Prints MB/s for each and the ratio store / baseline (1.0 = no overhead).

    python bench/store_throughput.py [--mb 256]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from timing import best_of

from reprorl.store import ContentStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="size of the test file in MiB")
    args = parser.parse_args()
    size = args.mb << 20
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = root / "source.bin"
        source.write_bytes(os.urandom(size))

        def baseline_write() -> None:
            hashlib.sha256(source.read_bytes()).hexdigest()
            shutil.copyfile(source, root / "copy.bin")
            with (root / "copy.bin").open("rb+") as handle:
                os.fsync(handle.fileno())

        def baseline_read() -> None:
            hashlib.sha256((root / "copy.bin").read_bytes()).hexdigest()

        counter = iter(range(1_000_000))

        def store_write() -> None:
            # A fresh store each time, so every write really writes.
            ContentStore(root / f"store-{next(counter)}").put_file(source)

        store = ContentStore(root / "store-read")
        address = store.put_file(source)

        def store_read() -> None:
            store.get_bytes(address)

        rows = [
            ("write", best_of(baseline_write), best_of(store_write)),
            ("verified read", best_of(baseline_read), best_of(store_read)),
        ]
    mib = size / (1 << 20)
    print(f"{'operation':<14} {'baseline MB/s':>14} {'store MB/s':>11} {'store/baseline':>15}")
    for name, base_s, store_s in rows:
        print(f"{name:<14} {mib / base_s:>14.0f} {mib / store_s:>11.0f} {base_s / store_s:>15.2f}")


if __name__ == "__main__":
    main()
