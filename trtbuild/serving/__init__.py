"""What a runtime loads: serving options of a checkpoint, the loader check."""
