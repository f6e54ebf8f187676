"""The keyword arguments TensorRT-LLM's LLM API accepts, as the stand-in `LLM` checks them.

Read from NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py@a678b91aafbeff265cd0b764abb59d7def624ac2
(the 1.2.0rc line, the commit of executor/result.py this stand-in already follows): the pydantic
fields of BaseLlmArgs, TrtLlmArgs and TorchLlmArgs. The checks that use them are
tensorrt_llm/llmapi/llm.py@4c05a74891e4df8066f08ed4ce14b0972abe4e25: `_TorchLLM.__init__` pops
`backend` and refuses TrtLlmArgs-only fields (`_validate_args_for_torch_backend`), then
`BaseLLM.__init__` refuses any key that is not a field of the args class nor `_mpi_session` or
`backend`, with `ValueError(f"{self.__class__.__name__} got invalid argument: {key}")`."""

from __future__ import annotations

# BaseLLM.__init__'s own parameters (llm.py@4c05a748), each also a BaseLlmArgs field, with defaults.
EXPLICIT = {"tokenizer": None, "tokenizer_mode": "auto", "skip_tokenizer_init": False, "trust_remote_code": False,
            "tensor_parallel_size": 1, "dtype": "auto", "revision": None, "tokenizer_revision": None}

BASE_FIELDS = frozenset("""
model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code tensor_parallel_size dtype revision
tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node moe_cluster_parallel_size
moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp enable_lm_head_tp_in_adp cp_config
load_format fail_fast_on_attention_window_too_large enable_lora lora_config kv_cache_config
enable_chunked_prefill guided_decoding_backend batched_logits_processor iter_stats_max_iterations
request_stats_max_iterations peft_cache_config scheduler_config cache_transceiver_config
sparse_attention_config speculative_config max_batch_size max_input_len max_seq_len max_beam_width
max_num_tokens gather_generation_logits num_postprocess_workers postprocess_tokenizer_dir reasoning_parser
decoding_config mpi_session backend return_perf_metrics orchestrator_type
""".split())

TRT_FIELDS = BASE_FIELDS | frozenset("""
auto_parallel auto_parallel_world_size enable_tqdm workspace enable_build_cache
extended_runtime_perf_knob_config calib_config quant_config embedding_parallel_mode fast_build build_config
enable_prompt_adapter max_prompt_adapter_token batching_type normalize_log_probs
""".split())

TORCH_FIELDS = BASE_FIELDS | frozenset("""
build_config garbage_collection_gen0_threshold cuda_graph_config attention_dp_config disable_overlap_scheduler
moe_config attn_backend sampler_type enable_iter_perf_stats enable_iter_req_stats print_iter_log
perf_metrics_max_requests batch_wait_timeout_ms batch_wait_timeout_iters batch_wait_max_tokens_ratio
torch_compile_config enable_autotuner enable_layerwise_nvtx_marker load_format enable_min_latency
stream_interval force_dynamic_quantization allreduce_strategy checkpoint_loader checkpoint_format
kv_connector_config mm_encoder_only
""".split())


def check_kwargs(class_name: str, fields: frozenset, kwargs: dict) -> None:
    """BaseLLM.__init__'s check (llm.py@4c05a748): the same ValueError for the first bad key."""
    valid = set(fields) | {"_mpi_session", "backend"}
    for key in kwargs:
        if key not in valid:
            raise ValueError(f"{class_name} got invalid argument: {key}")


def check_torch_kwargs(kwargs: dict) -> None:
    """_TorchLLM._validate_args_for_torch_backend (llm.py@4c05a748), the same message."""
    specific = [key for key in kwargs if key in TRT_FIELDS - TORCH_FIELDS]
    if specific:
        raise ValueError(
            f"The following arguments are specific to TensorRT backend and cannot be used with PyTorch backend: "
            f"{specific}.\nPlease use 'from tensorrt_llm._tensorrt_engine import LLM' instead to use the "
            f"TensorRT backend.")
