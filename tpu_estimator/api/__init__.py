"""Configs, specs and mode keys: the data a user hands to the estimator."""
