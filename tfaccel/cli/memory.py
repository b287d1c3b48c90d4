"""``tfaccel memory --model resnet50 --batch-size 64 [--precision mixed_float16] [--json]``: what a step needs.

Prints the per-replica breakdown (parameters, gradients, optimizer slots, activations; with recomputation when the
model can be split) as a table, or as JSON with ``--json``, with two peaks: the device (allocator) peak and, for
one replica per process, the CPU process's peak (``--process-peak no`` skips it: it runs the model at batch 1 in a
child process). ``--measure`` also runs the step in a child process and shows the measured peaks beside the
estimate: TensorFlow's allocator peak and the process's VmHWM on the CPU, each GPU's allocator peak.
"""

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

_MIB = 2.0 ** 20
RECOMPUTE_CHOICES = ("auto", "all", "none")
PROCESS_PEAK_CHOICES = ("auto", "yes", "no")


def register(subparsers: "argparse._SubParsersAction") -> None:
    from tfaccel.models import MODEL_NAMES
    from tfaccel.precision import POLICY_NAMES
    from tfaccel.strategies.names import STRATEGY_NAMES
    from tfaccel.train.request import OPTIMIZER_NAMES

    parser = subparsers.add_parser("memory", help="estimate the memory of a training step (per replica, per ps shard)")
    parser.add_argument("--model", required=True, help=f"built-in ({', '.join(MODEL_NAMES)}) or path/to/file.py:fn")
    parser.add_argument("--batch-size", required=True, help="global batch size")
    parser.add_argument("--precision", default="float32",
                        help=f"{', '.join(POLICY_NAMES)} (default: float32)")
    parser.add_argument("--strategy", default="default",
                        help=f"one of {', '.join(STRATEGY_NAMES[1:])} (default: default)")
    parser.add_argument("--optimizer", default="adam",
                        help=f"one of {', '.join(OPTIMIZER_NAMES)} (its slots count; default: adam)")
    parser.add_argument("--recompute", default="auto",
                        help="auto (largest blocks, if the model can be split), all (every block) or none")
    parser.add_argument("--replicas", default="1", help="replicas in sync (workers under parameter_server)")
    parser.add_argument("--num-ps", default="1", help="parameter server tasks (parameter_server)")
    parser.add_argument("--input-shape", default=None, help="one example's shape, e.g. 224,224,3; also the length of the inputs a model leaves "
                             "open, e.g. 128 for KerasHub's token ids")
    parser.add_argument("--num-classes", default=None,
                        help="the num_classes given to the model's builder (default: the built-in model's, else 10)")
    parser.add_argument("--process-peak", default="auto",
                        help="estimate the CPU process's peak too: auto (when each process holds one replica), yes, no")
    parser.add_argument("--shard-optimizer-state", action="store_true",
                        help="estimate with the optimizer state sharded over the replicas (ZeRO-1; mirrored or "
                             "multi_worker with --replicas 2 or more), as tfaccel fit --shard-optimizer-state")
    parser.add_argument("--gradient-accumulation-steps", default="1",
                        help="micro-batches per update, as tfaccel fit --gradient-accumulation-steps: above 1, "
                             "counts its sums of the micro-batches on each replica")
    parser.add_argument("--measure", action="store_true", help="also measure one step here (child process on CPU)")
    parser.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    parser.set_defaults(func=run)


def _positive_int(option: str, raw: str) -> int:
    from tfaccel.errors import ConfigError

    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = 0
    if value < 1 or str(raw).strip() != str(value):
        raise ConfigError(f"{option}: must be a positive integer; received {raw!r}")
    return value


def parse_options(args: argparse.Namespace) -> Dict[str, Any]:
    """Validates the flags; every error names the flag, what it received and what is valid."""
    from tfaccel.errors import ConfigError, invalid_choice
    from tfaccel.memory.options import check_options
    from tfaccel.precision import POLICY_NAMES
    from tfaccel.strategies.names import STRATEGY_NAMES
    from tfaccel.train.request import OPTIMIZER_NAMES

    if args.precision not in POLICY_NAMES:
        raise invalid_choice("--precision", args.precision, POLICY_NAMES)
    if args.strategy not in STRATEGY_NAMES:
        raise invalid_choice("--strategy", args.strategy, STRATEGY_NAMES)
    if args.optimizer.lower() not in OPTIMIZER_NAMES:
        raise invalid_choice("--optimizer", args.optimizer, OPTIMIZER_NAMES)
    if args.recompute not in RECOMPUTE_CHOICES:
        raise invalid_choice("--recompute", args.recompute, RECOMPUTE_CHOICES)
    if args.process_peak not in PROCESS_PEAK_CHOICES:
        raise invalid_choice("--process-peak", args.process_peak, PROCESS_PEAK_CHOICES)
    shape: Optional[Tuple[int, ...]] = None
    if args.input_shape:
        try:
            shape = tuple(int(s) for s in args.input_shape.split(","))
        except ValueError:
            shape = ()
        if not shape or min(shape) < 1:
            raise ConfigError(f"--input-shape: expected positive integers separated by commas, e.g. 224,224,3; "
                              f"received {args.input_shape!r}")
    model = args.model
    if model.endswith(".py") or ":" in model or "/" in model:
        from tfaccel.models import get_model_builder

        get_model_builder(model)  # raises ConfigError naming the file or attribute
    else:
        from tfaccel.models import MODEL_NAMES

        if model not in MODEL_NAMES:
            raise invalid_choice("--model", model, MODEL_NAMES, hint="Or give path/to/file.py:build_model")
    replicas = _positive_int("--replicas", args.replicas)
    batch_size, num_ps = _positive_int("--batch-size", args.batch_size), _positive_int("--num-ps", args.num_ps)
    accumulation = _positive_int("--gradient-accumulation-steps", args.gradient_accumulation_steps)
    check_options(args.strategy, batch_size, replicas, num_ps, args.precision, args.optimizer.lower(),
                  args.shard_optimizer_state, accumulation)
    return {"model_or_name": model, "batch_size": batch_size,
            "precision": args.precision, "strategy": args.strategy, "optimizer": args.optimizer.lower(),
            "recompute": {"auto": None, "all": "all", "none": False}[args.recompute],
            "replicas": replicas, "num_ps": num_ps, "input_shape": shape,
            "num_classes": None if args.num_classes is None else _positive_int("--num-classes", args.num_classes),
            "process_peak": _process_peak(args.process_peak, args.strategy, replicas),
            "shard_optimizer_state": args.shard_optimizer_state, "gradient_accumulation_steps": accumulation}


def _process_peak(choice: str, strategy: str, replicas: int) -> bool:
    """``auto``: the process peak where each process holds one replica (the library says why elsewhere)."""
    from tfaccel.memory.estimate import PROCESS_STRATEGIES

    if choice != "auto":
        return choice == "yes"
    return strategy in PROCESS_STRATEGIES and (replicas == 1 or strategy in ("multi_worker", "horovod"))


def format_table(report: Dict[str, Any]) -> str:
    """The terminal table of :meth:`MemoryEstimate.to_dict` (MiB)."""
    rows: List[Tuple[str, str, str]] = [
        ("parameters", f"{report['parameter_bytes'] / _MIB:,.1f}", f"{report['parameters']:,} values"),
        ("gradients", f"{report['gradient_bytes'] / _MIB:,.1f}", "trainable parameters"),
        ("optimizer slots", f"{report['optimizer_bytes'] / _MIB:,.1f}",
         f"{report['optimizer']}" + (" (on the ps shards)" if report["strategy"] == "parameter_server" else "")),
        ("activations", f"{report['activation_bytes'] / _MIB:,.1f}",
         f"traced peak at batch {report['per_replica_batch']} per replica"),
        ("total per replica", f"{report['total_bytes'] / _MIB:,.1f}", "device (allocator) peak"),
    ]
    if report.get("optimizer_shard_bytes"):
        rows.insert(3, ("optimizer slots, sharded", f"{max(report['optimizer_shard_bytes']) / _MIB:,.1f}",
                        f"the largest of {report['replicas']} replicas' shares (ZeRO-1); counted in the total"))
    if report.get("accumulator_bytes"):
        rows.insert(-2, ("gradient sums", f"{report['accumulator_bytes'] / _MIB:,.1f}",
                         "gradient accumulation: one per trainable variable, on every replica"))
    if report.get("process_peak_bytes") is not None:
        rows.append(("process peak (CPU)", f"{report['process_peak_bytes'] / _MIB:,.1f}",
                     f"measured at batch 1 ({report['process_base_bytes'] / _MIB:,.0f} MiB) + traced activations"))
    if report["activation_bytes_recompute"] is not None:
        rows += [("activations, recompute", f"{report['activation_bytes_recompute'] / _MIB:,.1f}",
                  f"{len(report['recompute_blocks'])} blocks recomputed"),
                 ("total, recompute", f"{report['total_bytes_recompute'] / _MIB:,.1f}", "")]
    for i, shard in enumerate(report["ps_shard_bytes"]):
        rows.append((f"ps:{i}", f"{shard / _MIB:,.1f}", "variables + optimizer slots"))
    unavailable = report.get("measured_unavailable") or {}
    for device, peak in (report.get("measured") or {}).items():
        if peak is None:
            rows.append((f"measured peak {device}", "n/a", unavailable.get(device, "not available")))
        else:
            rows.append((f"measured peak {device}", f"{peak / _MIB:,.1f}", "one step"))
    title = (f"{report['model']}: batch {report['batch_size']} ({report['replicas']} replica(s), "
             f"{report['strategy']}), {report['precision']}")
    width = max(len(r[0]) for r in rows)
    body = [f"  {name:<{width}}  {mib:>10} MiB  {note}".rstrip() for name, mib, note in rows]
    return "\n".join([title] + body)


def _measure(options: Dict[str, Any]) -> Tuple[Dict[str, Optional[int]], Dict[str, str]]:
    """The measured peaks (None where a peak cannot be read here) and, for each missing one, why."""
    from tfaccel.memory.measure import measure_cpu_step

    result = measure_cpu_step(options["model_or_name"], batch_size=options["batch_size"] // options["replicas"],
                              precision=options["precision"], input_shape=options["input_shape"],
                              optimizer=options["optimizer"], mmap_threshold=None)
    allocator = result["allocator_peak"]
    unavailable = {"CPU allocator": result["allocator_peak_unavailable"]} if allocator is None else {}
    return ({"CPU allocator": None if allocator is None else int(allocator),
             "CPU process": int(result["process_hwm"]), **result["device_peaks"]}, unavailable)


def run(args: argparse.Namespace) -> int:
    options = parse_options(args)  # before TensorFlow loads: a bad flag is one line, without its start-up logs
    from tfaccel.memory.estimate import estimate_memory

    report = estimate_memory(**options).to_dict()
    if args.measure:
        report["measured"], report["measured_unavailable"] = _measure(options)
    sys.stdout.write((json.dumps(report) if args.json else format_table(report)) + "\n")
    return 0
