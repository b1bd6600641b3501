"""Looking inside models and runs: attention maps, complexity tables, figures, benchmarks."""
