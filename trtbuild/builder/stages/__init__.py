"""Pipeline stages: each a function of its declared inputs, run by the runner into a fresh folder.

Stages never import each other; only stages import torch, transformers or ModelOpt, lazily.
"""
