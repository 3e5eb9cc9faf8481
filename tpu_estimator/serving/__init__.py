"""The model server: TensorFlow Serving's REST API over `jax.export` artifacts (`tpu-estimator serve`)."""
