"""Resilience: what lets a job survive its machines. Backups (written atomically, guarded, checked before a
resume), preemption (an agreed step, a backup, exit 75), restart records, elastic world sizes and the side-car
evaluator's checkpoint watching.

The training flow calls it through :mod:`tfaccel.resilience.job` (where to resume, the callbacks that back the job
up, the preemption watch, what a finished job leaves); the launchers read :mod:`tfaccel.resilience.contract` (the
environment both sides agree on) and :mod:`tfaccel.resilience.restarts` (restart records). This package file
imports nothing, so the launcher's light modules can import ``contract`` without TensorFlow.
"""
