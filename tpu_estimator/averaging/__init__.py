"""Averaged weights (`TPUConfig.moving_average_decay`): a `StateComponent`."""
