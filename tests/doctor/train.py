"""An ordinary Keras training script for tfaccel doctor's CLI tests: `python train.py PLANT` (see plants.py),
`sharded` / `unsharded` (a dataset_fn through tfaccel.fit), `long_epoch` (a dataset of 1,200,000 steps), or
`crash` / `nofit` for the bad inputs."""

import sys

import plants

import tfaccel

plant = sys.argv[1] if len(sys.argv) > 1 else "none"
if plant == "crash":
    raise RuntimeError("planted crash")
x, y = plants.data()
model = plants.BUILDERS[plant if plant in plants.BUILDERS else "none"]()
if plant in ("sharded", "unsharded"):  # a dataset_fn(input_context) through tfaccel.fit
    tfaccel.fit(model, plants.dataset_fn(plant == "sharded"), epochs=1, steps_per_epoch=2, verbose=0)
elif plant == "long_epoch":  # a dataset whose epoch is 1,200,000 steps
    model.fit(plants.long_epoch(), epochs=1, verbose=0)
elif plant != "nofit":
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
