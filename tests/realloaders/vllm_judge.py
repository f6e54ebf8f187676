"""vLLM 0.33.0's own verdict on Hugging Face checkpoints: run inside the real-loader environment
(tests/realloaders/make_env.py), never by trtbuild itself.

    .realloaders/vllm-0.33.0/bin/python tests/realloaders/vllm_judge.py JOBS.json VERDICTS.json

JOBS.json: a list of {"name": ..., "folder": ..., "argv": [...]}; argv is what follows
`vllm serve FOLDER` (a packaged serving/vllm_args.json as `--flag value` pairs, or [] for a bare
checkpoint). VERDICTS.json gets one object per job, in order:
{"name", "accepted", "stage", "error", "message"}; stage says how far vLLM's code got:

- "parse": `EngineArgs.add_cli_args(FlexibleArgumentParser())` parses the argv (vLLM's own parser,
  choices and types) and `EngineArgs.from_cli_args` builds the engine arguments;
- "config": `EngineArgs.create_engine_config()`: the HF config read with transformers 5, the
  quantization method detected from config.json (ModelConfig._verify_quantization: the override
  probing, `--quantization` against the checkpoint's method), the ModelOpt config parsed
  (ModelOptFp8Config/ModelOptNvFp4Config.from_config: the accepted quant_algo list, KV algo,
  group size), the activation dtype against the method's supported dtypes, max_model_len against
  the model's, the cache/scheduler/parallel configs;
- "load": the model built by vLLM's model class with its quantization methods' `create_weights`
  (on the CPU, in the model dtype) and the checkpoint's tensors fed through vLLM's
  DefaultModelLoader.load_weights and the model's own load_weights (names, shapes and the
  weight_loaders' checks), with vLLM's default loaded-weights tracking (on for an unquantized
  model, where it exempts the linear layers; off for a quantized one: a parameter it tracks and the
  checkpoint does not fill is vLLM's "Following weights were not initialized from checkpoint"),
  as `vllm serve` with the packaged options loads it; then the attention layers' KV-cache scale processing
  (BaseKVCacheMethod.process_weights_after_loading: plain torch, no kernel), which vLLM runs after
  loading.
- "loaded": all of the above passed: accepted.

What cannot run here, without a GPU and without vLLM's compiled kernels (vllm._C is absent on
this CPU install of the CUDA wheel): the platform is vLLM's CpuPlatform (VLLM_TARGET_DEVICE=cpu),
so `create_engine_config`'s CUDA-only parts are not exercised: the compute-capability check of the
quantization method (CpuPlatform.get_device_capability() is None, so VllmConfig skips
`get_min_capability`), CudaPlatform.check_and_update_config (attention backend, CUDA graphs, block
size) and the memory profiling the workers do later; and after load_weights,
the linear and MoE methods' `process_weights_after_loading` (the kernel-specific repacking and scale
fusion) is not called.
Which SMs serve a format is therefore not judged here: that is trtbuild's support table.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only: nothing is fetched
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _message(exc: BaseException) -> str:
    """vLLM's own message: a pydantic ValidationError's wrapped error text, else str(exc)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            return str(first.get("msg", exc))
        except Exception:  # not pydantic's
            pass
    return str(exc) or type(exc).__name__


class Judge:
    def __init__(self) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        self.EngineArgs = EngineArgs
        self.parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
        self.distributed = False

    def _init_distributed(self, cfg) -> None:
        # one process, world size 1 (gloo on the loopback): the model's parallel layers need the groups
        from vllm.config import set_current_vllm_config
        from vllm.distributed import parallel_state as ps

        if self.distributed:
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with set_current_vllm_config(cfg):
            ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                            distributed_init_method=f"tcp://127.0.0.1:{port}")
            ps.initialize_model_parallel(1, 1)
        self.distributed = True

    def judge(self, folder: str, argv: list[str]) -> dict:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.utils.torch_utils import set_default_torch_dtype

        stage = "parse"
        try:
            err = io.StringIO()
            full = ["--model", folder, *argv]  # vLLM's defaults, as `vllm serve FOLDER ARGS` has them
            try:
                with contextlib.redirect_stderr(err):
                    args = self.parser.parse_args(full)
            except SystemExit:  # argparse's error(): its message is the last line it printed
                lines = [line for line in err.getvalue().splitlines() if line.strip()]
                return {"accepted": False, "stage": stage, "error": "SystemExit",
                        "message": lines[-1] if lines else "argument parser exited"}
            engine_args = self.EngineArgs.from_cli_args(args)
            stage = "config"
            cfg = engine_args.create_engine_config()
            stage = "load"
            self._init_distributed(cfg)
            with set_current_vllm_config(cfg):
                loader = get_model_loader(cfg.load_config)
                with set_default_torch_dtype(cfg.model_config.dtype), torch.device("cpu"):
                    model = loader.create_model(vllm_config=cfg, model_config=cfg.model_config)
                loader.load_weights(model, cfg.model_config)
                # The attention layers' KV-scale processing is plain torch, no kernel: run it as vLLM does
                # after loading (BaseKVCacheMethod.process_weights_after_loading, kv_cache.py: it asserts
                # when a layer has only one of k_scale / v_scale).
                from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod

                for module in model.modules():
                    if isinstance(getattr(module, "quant_method", None), BaseKVCacheMethod):
                        module.quant_method.process_weights_after_loading(module)
            return {"accepted": True, "stage": "loaded", "error": None, "message": None,
                    "quantization": cfg.model_config.quantization}
        except Exception as exc:  # vLLM refused: its own exception and message
            if os.environ.get("TRTBUILD_JUDGE_TRACEBACK"):
                traceback.print_exc()
            return {"accepted": False, "stage": stage, "error": type(exc).__name__, "message": _message(exc)}


def main(jobs_path: str, out_path: str) -> int:
    jobs = json.loads(open(jobs_path).read())
    judge = Judge()
    verdicts = []
    for job in jobs:
        verdict = judge.judge(job["folder"], [str(a) for a in job.get("argv", [])])
        verdicts.append({"name": job["name"], **verdict})
    with open(out_path + ".tmp", "w") as f:
        json.dump(verdicts, f, indent=1)
    os.replace(out_path + ".tmp", out_path)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: vllm_judge.py JOBS.json VERDICTS.json")
    sys.exit(main(sys.argv[1], sys.argv[2]))
