"""Facts: formats, runtimes, GPUs, TensorRT-LLM, target names; each held in one place."""
