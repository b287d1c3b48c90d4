"""Thin absl front end of `tfaccel bench`: python scripts/benchmark.py --quick --json bench_out/bench.json"""

import dataclasses

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_bool("quick", True, "small sizes, 3 rounds")
    flags.DEFINE_string("json", "bench_out/bench.json", "JSON report path")
    flags.DEFINE_string("png", "bench_out/bench.png", "bar chart path")
    flags.DEFINE_bool("scaling", True, "measure P4 (multi-process weak scaling)")
    flags.DEFINE_bool("stream", True, "measure P6 (training from TFRecord files against memory)")
    flags.DEFINE_enum("p5", "auto", ["auto", "on", "off"], "P5 (precision and XLA 'auto' vs float32): auto = with a GPU")


def main(argv: list) -> None:
    del argv
    from tfaccel.bench import BenchConfig, format_report, run_bench

    config = dataclasses.replace(BenchConfig.make(FLAGS.quick), scaling=FLAGS.scaling, stream=FLAGS.stream,
                                 p5=FLAGS.p5)
    print(format_report(run_bench(config, json_path=FLAGS.json, png_path=FLAGS.png)))


if __name__ == "__main__":
    define_flags()
    app.run(main)
