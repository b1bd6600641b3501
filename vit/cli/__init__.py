"""The command line: the top layer, which nothing in vit/ imports.

- `train.py`: `vit-train` and `python train.py`, the trainer as a Hydra app (its overrides checked first).
- one module per installed tool: `evaluate.py` is `vit-eval`, `export.py` `vit-export`, `predict.py` `vit-predict`,
  `average.py` `vit-average`, `consolidate.py` `vit-consolidate`, `shards.py` `vit-shards`, `cifar_jpegs.py`
  `vit-cifar-jpegs` (pyproject.toml's [project.scripts]).
- `args.py`: the one parser of the other tools' `key=value` arguments, and `run_script`, which runs a tool.

Every entry point ends with one of four exit codes, and says why in one line on stderr (vit/errors.py):

- 0: done, `--help`, or stopped cleanly by Ctrl-C/SIGTERM (a training's last.pt holds the step reached).
- 1: the input was good but what it asked for did not hold, `<what>: <message>`: an export that does not compute
  what PyTorch computes or an INT8 file that loses too much top-1 (`export check failed: ...`).
- 2: bad input, a setting, argument, file, path or checkpoint that cannot work, `<kind> error: <message>`
  (`config error: ...`, `usage error: ...`, `data error: ...`, `checkpoint error: ...`).
- 3: a training that diverged, its loss or its weights no longer finite (`training stopped: ...`).

A traceback is a bug.
"""
