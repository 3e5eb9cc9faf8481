"""The device mesh and the batch arithmetic over it."""
