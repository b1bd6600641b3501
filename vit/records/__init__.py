"""What a run leaves on disk and where it came from: files written atomically (checkpoints, metrics.json, exported
models), the run folder's check, and the provenance written beside every result (command, commit, machine,
versions). Above the weights (whose error a checkpoint that cannot be written raises), below the tasks, the trainer
and the tools."""
