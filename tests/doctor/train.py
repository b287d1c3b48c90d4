"""An ordinary Keras training script for tfaccel doctor's CLI tests: `python train.py PLANT` (see plants.py),
or `crash` / `nofit` for the bad inputs."""

import sys

import plants

plant = sys.argv[1] if len(sys.argv) > 1 else "none"
if plant == "crash":
    raise RuntimeError("planted crash")
x, y = plants.data()
model = plants.BUILDERS["none" if plant == "nofit" else plant]()
if plant != "nofit":
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
