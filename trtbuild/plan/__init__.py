"""Planning: a recipe into the target matrix, memory estimates, trtllm-build flags."""
