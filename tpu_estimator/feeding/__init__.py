"""Input feeding: input_fn's host batches become sharded device arrays, prefetched."""
