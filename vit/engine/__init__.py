"""What training, evaluation, export and analysis share, below all of them: checkpoints (their weights read by
vit/weights/), writing files atomically, building a model from its config, choosing device and precision, the
process group, compile scopes, the evaluation loop and the figures of attention and confusion."""
