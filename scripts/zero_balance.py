"""How evenly optimizer-state sharding (ZeRO-1) splits the real models' state over N replicas: whole variables
(tfaccel's partition, ``tfaccel.memory.shards.partition_by_bytes``) against flat buckets of equal size.

    python scripts/zero_balance.py --replicas 2,4,8 --json /tmp/zero_balance.json

For each model of the real suite, at the suite's "bench" size and at its published size (BERT base, GPT-2 base,
ResNet50 and MobileNetV3Small at 224x224 with 1,000 classes), built without weights: the trainable variables that
would be sharded (all but the Embedding tables, which stay unsharded), and per replica count the largest replica's
share over the mean share. Under multi_worker that ratio is also the exchange's bytes over one all-reduce's (each
row is padded to the largest share). Flat buckets split the elements evenly (the largest share exceeds the mean by
less than one element per replica), at the cost of a copy of every gradient and value into and out of the buffer.
"""

import json
import math
from typing import Any, Dict, List

import keras
from absl import app, flags

from tfaccel.compat.keras_zero import sparse_gradient_variables
from tfaccel.memory.shards import shard_loads
from tfaccel.real_suite import REAL_MODELS

PUBLISHED = {  # builder options of the published sizes
    "bert_classifier": dict(input_shape=(512,), vocab_size=30522, num_layers=12, num_heads=12, hidden_dim=768,
                            intermediate_dim=3072),
    "gpt2_causal_lm": dict(input_shape=(1024,), num_classes=50257, num_layers=12, num_heads=12, hidden_dim=768,
                           intermediate_dim=3072),
    "resnet50": dict(input_shape=(224, 224, 3), num_classes=1000),
    "mobilenet_v3_small": dict(input_shape=(224, 224, 3), num_classes=1000),
}


def define_flags() -> None:
    flags.DEFINE_list("replicas", ["2", "4", "8"], "replica counts")
    flags.DEFINE_list("models", list(REAL_MODELS), "models of the real suite")
    flags.DEFINE_string("json", None, "write the rows here")


def balance(model: Any, replicas: List[int]) -> Dict[str, Any]:
    """One model's row: its sharded variables' elements and the largest share over the mean, per replica count."""
    sparse = sparse_gradient_variables(model)
    sizes = [int(math.prod(v.shape)) for v in model.trainable_variables if v.path not in sparse]
    total = sum(sizes)
    row: Dict[str, Any] = {"parameters": int(sum(math.prod(v.shape) for v in model.trainable_variables)),
                           "sharded_parameters": total, "variables": len(sizes),
                           "largest_variable_share": max(sizes) / total}
    for n in replicas:
        mean = total / n
        row[f"x{n}"] = {"by_variable": max(shard_loads(sizes, n)) / mean, "flat_buckets": math.ceil(mean) / mean}
    return row


def main(argv: List[str]) -> None:
    del argv
    f = flags.FLAGS
    replicas = [int(n) for n in f.replicas]
    rows = []
    for name in f.models:
        spec = REAL_MODELS[name]
        for size, options in (("bench", {}), ("published", PUBLISHED.get(name))):
            if options is None:
                continue
            keras.backend.clear_session()
            row = {"model": name, "size": size, **balance(spec.build("bench", **options), replicas)}
            rows.append(row)
            cells = "  ".join(f"x{n} {row[f'x{n}']['by_variable']:.3f}" for n in replicas)
            print(f"{name:20s} {size:9s} {row['sharded_parameters']:>11,} of {row['parameters']:>11,} params in "
                  f"{row['variables']:4d} variables, largest {row['largest_variable_share']:.1%}; "
                  f"largest/mean: {cells}")
    if f.json:
        with open(f.json, "w") as fh:
            json.dump({"replicas": replicas, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
