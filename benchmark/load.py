"""Load generator of the CPU scenario, a process of its own.

Sends hit requests ("ID KEY\\n") over a unix socket to a store process at a
paced (steady or Poisson) rate or as fast as its answers allow, N at a time,
and measures what the store process and redis-server spend on them: CPU time
of every thread (/proc/PID/task/*/schedstat), per hit. Prints one JSON line.

    load.py SOCKET PIDS MODE RATE BURST SECONDS
      PIDS: the store process's pid and the server's (redis-server's, or every
            process of a PostgreSQL cluster), comma-separated
      MODE: steady | poisson | saturated (RATE is then ignored)
      BURST: hits sent together at each arrival (at most that many in flight)
"""

import json
import os
import random
import socket
import sys
import threading
import time

KEYS = 10_000
WARMUP = 0.5


def cpu_ns(pid):
    """On-CPU time of every thread of pid so far, in ns."""
    total = 0
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except FileNotFoundError:
        return 0
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def user_system_ns(pid):
    """User and system CPU time of every thread of pid so far, in ns (clock ticks: 10 ms each)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: the fields after it start past its ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) * TICK_NS, int(fields[12]) * TICK_NS


def main():
    path, pids, mode, rate, burst, seconds = sys.argv[1:7]
    store_pid, *server_pids = (int(p) for p in pids.split(","))
    rate, burst, seconds = float(rate), int(burst), float(seconds)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sent_at = {}
    latencies = []
    errors = [0]
    lock = threading.Lock()
    free = threading.Semaphore(burst)
    window = {"open": False, "hits": 0}
    done = threading.Event()

    def receive():
        buffer = b""
        while not done.is_set() or sent_at:
            chunk = sock.recv(65536)
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            now = time.perf_counter()
            with lock:
                for line in lines:
                    if line.startswith(b"E"):
                        errors[0] += 1
                        line = line[2:]
                    start = sent_at.pop(int(line), None)
                    if start is not None and window["open"]:
                        latencies.append(now - start)
                        window["hits"] += 1
            for _ in lines:
                free.release()

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    gap = burst / rate if mode != "saturated" else 0.0
    begin = time.perf_counter()
    end = begin + WARMUP + seconds
    next_at = begin
    i = 0
    before = None
    while True:
        now = time.perf_counter()
        if before is None and now >= begin + WARMUP:
            with lock:
                window["open"] = True
            before = (time.perf_counter(), cpu_ns(store_pid), sum(cpu_ns(p) for p in server_pids), *user_system_ns(store_pid))
        if now >= end:
            break
        if gap > 0:
            if next_at > now:
                time.sleep(next_at - now)
            next_at += random.expovariate(1 / gap) if mode == "poisson" else gap
        for _ in range(burst):
            free.acquire()
        lines = []
        with lock:
            stamp = time.perf_counter()
            for _ in range(burst):
                sent_at[i] = stamp
                lines.append(f"{i} k{i % KEYS}\n")
                i += 1
        sock.sendall("".join(lines).encode())
    with lock:
        window["open"] = False
    after = (time.perf_counter(), cpu_ns(store_pid), sum(cpu_ns(p) for p in server_pids), *user_system_ns(store_pid))
    done.set()
    for _ in range(burst):
        free.acquire()
    sock.close()
    hits = window["hits"]
    elapsed = after[0] - before[0]
    latencies.sort()

    def quantile(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6 if latencies else float("nan")

    print(
        json.dumps(
            {
                "hits": hits,
                "seconds": elapsed,
                "rate": hits / elapsed,
                "storeUsPerHit": (after[1] - before[1]) / 1000 / max(hits, 1),
                "storeCores": (after[1] - before[1]) / 1e9 / elapsed,
                "storeUserUsPerHit": (after[3] - before[3]) / 1000 / max(hits, 1),
                "storeSystemUsPerHit": (after[4] - before[4]) / 1000 / max(hits, 1),
                "redisUsPerHit": (after[2] - before[2]) / 1000 / max(hits, 1),
                "p50": quantile(0.5),
                "p99": quantile(0.99),
                "errors": errors[0],
            }
        )
    )


main()
