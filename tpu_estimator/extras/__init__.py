"""The built-in `StateComponent`s (model/components.py), one module each: state kept in
`TrainState.extras` (averaged weights; float16's dynamic loss scale). Each is imported
only when its setting asks for it (estimator/components.py)."""
