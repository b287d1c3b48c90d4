"""``tfaccel bench [--quick] [--json FILE] [--png FILE] [--p5 auto|on|off] [--suite reference|real]``: measure the
speed-ups side by side."""

import argparse
import dataclasses
import sys
from typing import Any

from tfaccel.bench.config import SUITES
from tfaccel.bench.real_zero_run import ZERO_PATHS, check_zero_config, format_real_zero
from tfaccel.errors import ConfigError


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser("bench", help="measure compile_and_fit's speed-ups and scaling side by side")
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds (a few minutes on 2 cores)")
    parser.add_argument("--json", dest="json_path", default=None, help="write the JSON report here")
    parser.add_argument("--png", dest="png_path", default=None, help="write a bar chart here")
    parser.add_argument("--no-scaling", action="store_true", help="skip P4 (multi-process weak scaling)")
    parser.add_argument("--no-stream", action="store_true", help="skip P6 (training from TFRecord files)")
    parser.add_argument("--seed", type=int, default=0, help="seed of each round's contender order (default 0)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per figure (default 3 quick, 5 full)")
    parser.add_argument("--p5", default="auto", metavar="auto|on|off",
                        help="P5, ResNet-50 with precision and XLA 'auto' / float32 without XLA: 'auto' (default) "
                             "only where a GPU is present, 'on' run anyway (on CPU the ratio is ~1), 'off' skip")
    parser.add_argument("--suite", default="reference", choices=SUITES,
                        help="'reference' (default): P1-P6 on the reference models; 'real': plain fit against "
                             "tfaccel.fit on the real models (tfaccel.real_suite), per path, JSON key 'real'")
    parser.add_argument("--real-models", default=None, metavar="A,B",
                        help="real models to run (default: all of tfaccel.real_suite)")
    parser.add_argument("--real-paths", default=None, metavar="A,B",
                        help="paths to run: default, mirrored, multi_worker (default: all)")
    parser.add_argument("--real-size", default="bench", help="job size of the real models: bench (default) or test")
    parser.add_argument("--real-limits", default=None, metavar="A,B",
                        help="limit contenders on the default path: xla, noxla (default: both; 'none': neither)")
    parser.add_argument("--real-zero", default=None, metavar="2,4",
                        help="with --suite real: the ZeRO rows instead (optimizer-state sharding against the "
                             "unsharded state at these replica counts, on --real-paths mirrored,multi_worker,horovod), "
                             "JSON key real_zero")
    parser.set_defaults(func=run)


def real_config(config: Any, args: argparse.Namespace) -> Any:
    """The real suite's BenchConfig from the CLI's options (comma lists; ``--real-limits none``: no limit contender).

    Raises:
        ConfigError: an unknown model, path, size or limit contender.
    """
    from tfaccel.bench.real import check_real_config

    config = dataclasses.replace(config, suite="real", real_size=args.real_size)
    if args.real_zero is not None:
        config = _zero_config(config, args)
    for option in ("real_models", "real_paths", "real_limits"):
        value = getattr(args, option)
        if option == "real_limits" and value == "none":
            config = dataclasses.replace(config, real_limits=())
        elif value is not None:
            config = dataclasses.replace(config, **{option: tuple(v.strip() for v in value.split(",") if v.strip())})
    check_real_config(config)
    return config


def _zero_config(config: Any, args: argparse.Namespace) -> Any:
    """``--real-zero N,M``: the ZeRO rows' replica counts; their paths default to mirrored, multi_worker and horovod."""
    try:
        counts = tuple(int(v) for v in args.real_zero.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"--real-zero takes replica counts such as 2,4; received {args.real_zero!r}") from None
    paths = ZERO_PATHS if args.real_paths is None else tuple(v.strip() for v in args.real_paths.split(",") if v.strip())
    config = dataclasses.replace(config, real_zero=counts, real_paths=paths)
    check_zero_config(config)
    return config


def run(args: argparse.Namespace) -> int:
    from tfaccel.bench import BenchConfig, format_report, run_bench

    config = BenchConfig.make(args.quick)
    if args.repeats is not None:
        if args.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1; received {args.repeats}")
        config = dataclasses.replace(config, repeats=args.repeats)
    if args.no_scaling:
        config = dataclasses.replace(config, scaling=False)
    if args.no_stream:
        config = dataclasses.replace(config, stream=False)
    from tfaccel.bench.precision import check_p5_mode

    config = dataclasses.replace(config, seed=args.seed, p5=check_p5_mode(args.p5, option="--p5"))
    if args.suite == "real":
        from tfaccel.bench.real import format_real

        config = real_config(config, args)
        report = run_bench(config, json_path=args.json_path)
        if config.real_zero:
            sys.stdout.write("\n".join(format_real_zero(report["real_zero"])) + "\n")
            return 0
        if args.png_path:
            from tfaccel.bench.real_report import plot_real

            plot_real(report, args.png_path)
        sys.stdout.write(format_real(report) + "\n")
        return 0
    report = run_bench(config, json_path=args.json_path, png_path=args.png_path)
    sys.stdout.write(format_report(report) + "\n")
    return 0
