"""Reading a model's files: its config, file set, GGUF header, the Hugging Face Hub."""
