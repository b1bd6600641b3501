"""From splits to batches: `build_data` picks a loader (the torch loader, the device-resident loader, or the stream
of tar shards) and assembles the `DataBundle` the trainer reads."""
