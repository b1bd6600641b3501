"""Looking inside models and runs: attention maps and rollout, position-embedding and register figures, complexity
tables, a runs summary and a search's study. The project's own measurements live beside the package, in lab/."""
