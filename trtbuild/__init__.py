"""trtbuild: turn model checkpoints into validated, cached, ready-to-serve TensorRT-LLM artifacts.

Importing the package is cheap on purpose: nothing here imports torch, transformers or ModelOpt;
only the stages that need them do, lazily.
"""

__version__ = "0.1.0"
