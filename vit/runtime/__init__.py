"""Where and how the computation runs: the device and the precision (`device.py`), the torchrun process group
(`distributed.py`), FSDP2's sharded units (`sharding.py`), the compiled blocks (`compile.py`) and what the C
allocator does with freed memory (`host_memory.py`). Above the models (it names their blocks), below the tasks, the
trainer and the tools that run them."""
