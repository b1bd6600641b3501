"""Weights, from wherever they come to the model that takes them: `read.py` (`read_weights`, the one reader of every
source: timm names, checkpoints of this trainer, state-dict files), `files.py` (opening a file: safetensors or
`torch.load(weights_only=True)`), `sharded.py` (a sharded checkpoint folder read whole), `timm_names.py` (timm's
families' keys and layouts in ours) and `fit.py` (fitting what was read to a model: the architecture checked,
position tables and patch kernels resampled, a classifier replaced). Above the models, below the tasks; timm's
own architectures are read in vit/models/foundation.py."""
