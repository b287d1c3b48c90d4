"""The ``tfaccel`` command line: small verbs (env, tf-config, launch, fit, bench)."""
