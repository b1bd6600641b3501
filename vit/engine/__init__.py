"""What training, evaluation, export and analysis share, below all of them: reading weights and checkpoints,
writing files atomically, building a model from its config, choosing device and precision, the process group,
compile scopes, the evaluation loop and the figures of attention and confusion."""
