"""The training loops ``tfaccel.fit`` chooses from (one module each): keras_fit, compiled, coordinator."""
