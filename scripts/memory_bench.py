"""Measures recomputation's memory saving and time cost, and the memory estimate against measured peaks (CPU).

    python scripts/memory_bench.py --json /tmp/memory_bench.json

Thin: the logic is in tfaccel.memory.bench. Runs every measurement in its own child process, one at a time.
"""

import json
import sys
from typing import List

from absl import app, flags


def define_flags() -> None:
    flags.DEFINE_string("model", "resnet50", "model for the recompute comparison")
    flags.DEFINE_list("input_shape", ["224", "224", "3"], "input shape for the recompute comparison")
    flags.DEFINE_integer("batch_size", 16, "batch for the recompute comparison")
    flags.DEFINE_integer("small_batch", 2, "small batch whose peak is subtracted (framework overhead)")
    flags.DEFINE_list("cases", ["resnet50:224x224x3:8", "resnet50:224x224x3:16", "resnet20:32x32x3:256",
                                "resnet20:32x32x3:512", "transformer:256:32", "transformer:256:64"],
                      "model:input_shape:batch for estimate vs measured")
    flags.DEFINE_list("parts", ["recompute", "estimates", "timing"], "which parts to run")
    flags.DEFINE_integer("timing_batch", 8, "batch of the side-by-side step-time comparison")
    flags.DEFINE_integer("timing_steps", 6, "interleaved steps per mode in the side-by-side comparison")
    flags.DEFINE_string("json", None, "write the results here")


def main(argv: List[str]) -> None:
    del argv
    from tfaccel.log import configure_logging
    from tfaccel.memory.bench import estimate_benchmark, format_bench, recompute_benchmark, timing_benchmark

    configure_logging()
    f = flags.FLAGS
    shape = tuple(int(s) for s in f.input_shape)
    unknown = sorted(set(f.parts) - {"recompute", "estimates", "timing"})
    if unknown:
        raise app.UsageError(f"--parts: unknown {unknown}; valid: recompute, estimates, timing")
    rec = None
    if "recompute" in f.parts:
        rec = recompute_benchmark(f.model, batch_size=f.batch_size, small_batch=f.small_batch, input_shape=shape)
    cases = [(m, tuple(int(s) for s in dims.split("x")), int(b)) for m, dims, b in (c.split(":") for c in f.cases)]
    # Measured afresh with glibc's defaults (the recompute part's children ask for mmap above 1 MiB).
    rows = estimate_benchmark(cases) if "estimates" in f.parts else []
    timing = None
    if "timing" in f.parts:
        timing = timing_benchmark(f.model, batch_size=f.timing_batch, input_shape=shape, steps=f.timing_steps)
    sys.stdout.write(format_bench(rec, rows, timing) + "\n")
    if f.json:
        with open(f.json, "w") as handle:
            json.dump({"recompute": rec, "estimates": rows, "timing": timing}, handle, indent=1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
