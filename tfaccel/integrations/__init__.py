"""Reporting a training run to the frameworks around it (Ray Train), from inside the training process."""
