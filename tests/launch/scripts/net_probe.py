"""The command task of the network-isolation tests: reports the network it sees, then waits for the test.

Prints one JSON line: its network namespace, the interfaces of that namespace, every LISTEN socket there
(address, port) and the cluster's ports from TF_CONFIG. Then waits (at most 120 s) for the file named by argv[1]
so that the test can look at the cluster from outside while the servers are up.
"""

import json
import os
import socket
import sys
import time
from pathlib import Path


def listening():
    out = []
    for table, family in (("/proc/self/net/tcp", socket.AF_INET), ("/proc/self/net/tcp6", socket.AF_INET6)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            addr_hex, port_hex = fields[1].rsplit(":", 1)
            raw = bytes.fromhex(addr_hex)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.append([socket.inet_ntop(family, raw), int(port_hex, 16)])
    return out


def main() -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    ports = {f"{role}:{i}": int(addr.rpartition(":")[2])
             for role, addrs in config["cluster"].items() for i, addr in enumerate(addrs)}
    interfaces = sorted(line.split(":")[0].strip() for line in Path("/proc/self/net/dev").read_text().splitlines()[2:])
    report = {"netns": os.readlink("/proc/self/ns/net"), "interfaces": interfaces, "listening": listening(),
              "ports": ports, "task": config["task"]}
    print("NETPROBE " + json.dumps(report), flush=True)
    done = Path(sys.argv[1])
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return 0 if done.exists() else 3


if __name__ == "__main__":
    sys.exit(main())
