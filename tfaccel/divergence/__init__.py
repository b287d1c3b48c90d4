"""The divergence doctor (``tfaccel.doctor``, ``tfaccel doctor``): why does my model train differently on N replicas?

``record`` runs K steps of the model's own ``train_step`` and records what each step left behind; ``feed`` is what
a run is fed (the global batches cut over the replicas, or the user's ``dataset_fn``) and which examples each step
saw; ``loop`` records a custom training loop's step in its place; ``compare`` finds where two runs part; ``causes``
is the catalogue of reasons; ``plot`` draws both runs; ``api`` is ``tfaccel.doctor``; ``child`` runs a user's
unmodified script in a child process (or, with ``--workers``, in each worker process) of
``tfaccel doctor -- python train.py``.
"""

from tfaccel.divergence.api import DoctorReport, doctor

__all__ = ["DoctorReport", "doctor"]
