#!/usr/bin/env python3
"""A small stream protocol benchmark (not a test): one rstream publisher
with confirms (1 KB messages, batches of 100) then one consumer from
`first`, against a broker already running; reports msg/s and the broker's
CPU per message (utime + stime of its pid from /proc, so only for a broker
on this machine).

    scripts/stream-protocol-bench.py PORT PID [MESSAGES]

scripts/stream-protocol-bench.sh runs it side by side against berth and
RabbitMQ 3.10.8 (`rabbitmq_stream`) and prints min/median/max.
"""

import asyncio
import json
import os
import sys
import time

from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, Producer

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def main(port, pid, n):
    stream = f"bench-{os.getpid()}-{time.time_ns()}"
    body = b"x" * 1000
    confirmed = 0
    all_confirmed = asyncio.Event()

    async def on_confirm(status):
        nonlocal confirmed
        confirmed += 1
        if confirmed == n:
            all_confirmed.set()

    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.create_stream(stream)
        cpu0, t0 = cpu_s(pid), time.monotonic()
        for i in range(0, n, 100):
            await p.send_batch(stream, [body] * min(100, n - i), on_publish_confirm=on_confirm)
        await asyncio.wait_for(all_confirmed.wait(), 300)
        pub = (time.monotonic() - t0, cpu_s(pid) - cpu0)

    got = 0
    all_read = asyncio.Event()

    async def on_message(msg, ctx):
        nonlocal got
        got += 1
        if got == n:
            all_read.set()

    async with Consumer("127.0.0.1", port, username="guest", password="guest") as c:
        cpu0, t0 = cpu_s(pid), time.monotonic()
        await c.subscribe(stream, on_message,
                          offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        await asyncio.wait_for(all_read.wait(), 300)
        con = (time.monotonic() - t0, cpu_s(pid) - cpu0)
    async with Producer("127.0.0.1", port, username="guest", password="guest") as p:
        await p.delete_stream(stream)
    print(json.dumps({
        "messages": n,
        "publish_msg_s": n / pub[0], "publish_cpu_us_per_msg": pub[1] * 1e6 / n,
        "consume_msg_s": n / con[0], "consume_cpu_us_per_msg": con[1] * 1e6 / n,
    }))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]),
                     int(sys.argv[3]) if len(sys.argv) > 3 else 100_000))
