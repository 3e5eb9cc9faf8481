"""The estimator: host-side drivers of train, evaluate and predict."""
