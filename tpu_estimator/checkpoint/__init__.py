"""Checkpoints: an Orbax CheckpointManager behind a small adapter."""
