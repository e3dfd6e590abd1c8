#!/usr/bin/env python3
"""What writing into the page cache costs this machine when what was
written is dropped from the cache behind the writer, against keeping it
(docs/BENCHMARKS.md, "Dropping written segments from the page cache").

Appends GIB GiB to one file in 1 MiB writes, fdatasyncs every SYNC_MIB,
and (with --keep-mib K >= 0) asks the kernel to drop everything more than
K MiB behind the end (posix_fadvise DONTNEED, clean after the fdatasync),
as a store that drops sealed segments would. Prints, per GiB: this
process's system and user CPU, the time spent in fadvise, elapsed time,
and the machine's free and cached memory after it.

On a VM whose free memory goes back to the host (virtio-balloon free page
reporting), a page the host no longer backs costs far more to fill than
one it still does: the question is whether pages dropped and reused at
once stay cheap.

    scripts/page-cache-drop.py [--gib 16] [--dir /var/tmp] [--sync-mib 64] [--keep-mib -1]

--keep-mib -1 (the default) never drops: the control. Needs GIB GiB free
in DIR; the file is removed on exit. Not part of scripts/test.sh; run it
under `flock /tmp/berth-bench.lock` on a shared machine.
"""
import argparse
import os
import resource
import tempfile
import time

MIB = 1 << 20


def meminfo():
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            m[k] = int(v.split()[0]) // 1024
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--sync-mib", type=int, default=64)
    ap.add_argument("--keep-mib", type=int, default=-1)
    a = ap.parse_args()
    try:
        order = open("/sys/module/page_reporting/parameters/page_reporting_order").read().strip()
    except OSError:
        order = "none"
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    m = meminfo()
    print(f"# {os.uname().release}; page_reporting_order {order}; load {load}; "
          f"sync every {a.sync_mib} MiB; keep {a.keep_mib} MiB "
          f"({'never drop' if a.keep_mib < 0 else 'drop behind'}); "
          f"free {m['MemFree']} MiB, cached {m['Cached']} MiB before")
    print("# GiB  sys_s  user_s  fadvise_s  elapsed_s  free_MiB  cached_MiB")
    fd, path = tempfile.mkstemp(prefix="berth-page-cache-drop-", dir=a.dir)
    buf = os.urandom(MIB)
    written = dropped = 0
    tot_sys = tot_fadv = 0.0
    try:
        for gib in range(1, a.gib + 1):
            r0, t0, fadv = resource.getrusage(resource.RUSAGE_SELF), time.monotonic(), 0.0
            for _ in range(1024):
                os.write(fd, buf)
                written += MIB
                if written % (a.sync_mib * MIB) == 0:
                    os.fdatasync(fd)
                    if a.keep_mib >= 0 and written - a.keep_mib * MIB > dropped:
                        f0 = time.monotonic()
                        upto = written - a.keep_mib * MIB
                        os.posix_fadvise(fd, dropped, upto - dropped, os.POSIX_FADV_DONTNEED)
                        fadv += time.monotonic() - f0
                        dropped = upto
            r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            m = meminfo()
            sys_s = r1.ru_stime - r0.ru_stime
            tot_sys += sys_s
            tot_fadv += fadv
            print(f"{gib} {sys_s:.2f} {r1.ru_utime - r0.ru_utime:.2f} {fadv:.3f} {t1 - t0:.2f} "
                  f"{m['MemFree']} {m['Cached']}", flush=True)
        print(f"# total sys {tot_sys:.2f} s ({tot_sys / a.gib:.2f} s/GiB), of which fadvise "
              f"{tot_fadv:.2f} s")
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
