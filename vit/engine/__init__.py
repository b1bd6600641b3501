"""What training, evaluation, export and analysis share, above the models, the data, the weights and the runtime:
writing files atomically, a model from its config, the config's composition and value types, the evaluation loop,
the figures of attention and confusion, where a measurement came from, and the tasks (what a run trains for)."""
