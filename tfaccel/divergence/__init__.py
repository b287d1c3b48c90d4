"""The divergence doctor (``tfaccel.doctor``, ``tfaccel doctor``): why does my model train differently on N replicas?

``record`` runs K steps of the model's own ``train_step`` and records what each step left behind; ``compare``
finds where two runs part; ``causes`` is the catalogue of reasons; ``api`` is ``tfaccel.doctor``; ``child`` runs a
user's unmodified script in a child process of ``tfaccel doctor -- python train.py``.
"""

from tfaccel.divergence.api import DoctorReport, doctor

__all__ = ["DoctorReport", "doctor"]
