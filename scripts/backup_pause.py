"""Prints the pause a backup causes in the step loop, today's synchronous save against the asynchronous one.

    python scripts/backup_pause.py --json /tmp/backup_pause.json
    python scripts/backup_pause.py --models resnet50 --backups 6 --steps_between 2

Thin: the measurement is tfaccel.bench.backup_pause. ResNet50 (keras.applications, weights=None) and a KerasHub
BertTextClassifier built from a config (nothing downloaded), Adam, on this machine's CPU. The figures depend on the
disk and on how loaded the machine is (the writer thread shares the cores with training): say both beside them.
"""

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Tuple

from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # models/

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_list("models", ["resnet50", "bert"], "which models: resnet50, bert")
    flags.DEFINE_integer("backups", 4, "backups per mode")
    flags.DEFINE_integer("steps_between", 6, "training steps between two backups")
    flags.DEFINE_integer("batch_size", 8, "batch of each step")
    flags.DEFINE_string("backup_dir", None, "where the backups go (default: a temporary directory on the disk)")
    flags.DEFINE_string("json", None, "also write the results here")


def _model(name: str) -> Tuple[Any, Any, Any]:
    """(compiled model, x, y) for one batch."""
    import keras

    from models import applications, bert_classifier

    keras.utils.set_random_seed(0)
    if name == "resnet50":
        model = applications.build_resnet50(input_shape=(64, 64, 3), num_classes=10)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
        x, y = applications.make_data(FLAGS.batch_size, input_shape=(64, 64, 3), num_classes=10)
        return model, x, y
    if name == "bert":  # BERT-small-like: 4 layers, hidden 256, BERT's 30522-token vocabulary
        model = bert_classifier.build_model(input_shape=(64,), vocab_size=30522, num_layers=4, num_heads=4,
                                            hidden_dim=256, intermediate_dim=1024)
        bert_classifier.compile_model(model)
        x, y = bert_classifier.make_data(FLAGS.batch_size, sequence_length=64, vocab_size=30522)
        return model, x, y
    raise app.UsageError(f"--models: unknown {name!r}; valid: resnet50, bert")


def _line(name: str, runs: Dict[str, Any]) -> str:
    sync, asyn, cached = runs["sync"], runs["async"], runs["sync_cached"]
    return (f"{name}: backup {sync['backup_bytes'] / 1e6:.0f} MB; step {asyn['step_s']:.3f} s "
            f"({asyn['step_s_during_write'] or float('nan'):.3f} s while a write runs); pause: sync {sync['pause_s']:.3f} s, "
            f"async {asyn['pause_s']:.3f} s = {runs['async_over_sync']:.0%} of sync "
            f"(sync with Keras' skip-set cache filled {cached['pause_s']:.3f} s: async = "
            f"{runs['async_over_sync_cached']:.0%}); background write {asyn['write_s']:.3f} s; waited for the previous "
            f"write {asyn['waited']}x (async pause without waiting {asyn['pause_without_wait_s']:.3f} s)")


def main(argv: List[str]) -> None:
    del argv
    from tfaccel.bench.backup_pause import compare_modes

    results = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}
    for name in FLAGS.models:
        model, x, y = _model(name)
        with tempfile.TemporaryDirectory(prefix="tfaccel-backup-pause-", dir=FLAGS.backup_dir) as work:
            results[name] = compare_modes(model, x, y, backup_dir=os.path.join(work, "backup"),
                                          backups=FLAGS.backups, steps_between=FLAGS.steps_between)
        print(_line(name, results[name]), flush=True)
    print(f"load average {results['load_average'][0]:.1f} on {results['cpus']} CPUs", flush=True)
    if FLAGS.json:
        Path(FLAGS.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    define_flags()
    app.run(main)
