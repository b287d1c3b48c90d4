"""Measures optimizer-state sharding (ZeRO-1): bytes of optimizer state per replica's device and step time, sharded
against unsharded, on mirrored virtual CPUs (one child process per replica count, one at a time).

    python scripts/zero_bench.py --replicas 2,4 --json /tmp/zero_bench.json

Thin: the logic is in tfaccel.memory.zero_bench.
"""

import json
import subprocess
import sys
from typing import List

from absl import app, flags


def define_flags() -> None:
    flags.DEFINE_list("replicas", ["2", "4"], "replica counts (virtual CPUs), one child process each")
    flags.DEFINE_integer("width", 512, "units of each hidden Dense layer")
    flags.DEFINE_integer("depth", 4, "hidden Dense layers")
    flags.DEFINE_integer("batch_size", 256, "global batch")
    flags.DEFINE_integer("epochs", 3, "epochs per run (the first is left out of the step time)")
    flags.DEFINE_integer("rounds", 2, "sharded/unsharded runs, alternating")
    flags.DEFINE_integer("child", 0, "internal: run the measurement for this many replicas here")
    flags.DEFINE_string("json", None, "write the results here")


def main(argv: List[str]) -> None:
    del argv
    f = flags.FLAGS
    if f.child:
        import tfaccel
        from tfaccel.memory.zero_bench import zero_benchmark

        tfaccel.configure_devices(virtual_cpus=f.child)
        sys.stdout.write(json.dumps(zero_benchmark(width=f.width, depth=f.depth, batch=f.batch_size,
                                                   epochs=f.epochs, rounds=f.rounds)) + "\n")
        return
    results = []
    for n in f.replicas:
        args = [sys.executable, __file__, f"--child={n}", f"--width={f.width}", f"--depth={f.depth}",
                f"--batch_size={f.batch_size}", f"--epochs={f.epochs}", f"--rounds={f.rounds}"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        r = results[-1]
        sys.stdout.write(f"N={r['replicas']}: optimizer bytes per device unsharded "
                         f"{sorted(r['unsharded']['bytes_per_device'].values())}, sharded "
                         f"{sorted(r['sharded']['bytes_per_device'].values())}; step {r['unsharded']['step_seconds']:.4f}"
                         f" s vs {r['sharded']['step_seconds']:.4f} s (ratio {r['ratio']:.2f}); load {r['load_average']}\n")
    if f.json:
        with open(f.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
