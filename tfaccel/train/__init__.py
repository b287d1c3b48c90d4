"""Training: ``tfaccel.scope``, ``tfaccel.fit`` and ``compile_and_fit``, data preparation, optimizer wrappers, backups, loops."""
