"""TensorRT-LLM checkpoints: a streaming Hugging Face converter and a checkpoint verifier."""
