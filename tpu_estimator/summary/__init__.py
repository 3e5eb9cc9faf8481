"""TensorBoard summaries: event files written off the training path."""
