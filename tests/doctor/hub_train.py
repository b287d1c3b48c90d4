"""A training script on the real-model suite's KerasHub BertTextClassifier ("test" size, tfaccel.real_suite), for
tfaccel doctor's end-to-end test: `python hub_train.py DROPOUT` (0.0: no random layer draws; > 0: dropout in the
backbone and the head, drawn per replica)."""

import sys

from tfaccel.real_suite import get_real_model

spec = get_real_model("bert_classifier")
x, y = spec.data("test")
model = spec.build("test", dropout=float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)
model.fit(x, y, batch_size=spec.job("test").batch_size, epochs=1, verbose=0)
