"""Deploying: push, pull's selection, ls, the engine check, the remote build cache."""
