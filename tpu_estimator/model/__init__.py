"""The user's model_fn as a Flax module, and the training state it updates."""
