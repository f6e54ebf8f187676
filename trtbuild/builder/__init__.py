"""Building: the stage graph and its keys, the runner, the stages."""
