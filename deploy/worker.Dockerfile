# syntax=docker/dockerfile:1
# amptrain GPU worker: the Celery supervisor and the training child, nothing of the API.
#
# Build from the repository root:
#   docker build -f deploy/worker.Dockerfile -t amptrain-worker:0.1.0 .
#
# Base: the official PyTorch image, PyTorch 2.9.1 + CUDA 12.8 + cuDNN 9 (runtime flavour;
# NCCL ships inside the torch build; Python 3.11). Pinned by tag AND digest so a re-pushed tag
# cannot change the verified combination. The digest is the linux/amd64-capable index digest
# public projects pin for this tag; before a release re-check it with
#   docker buildx imagetools inspect pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
# and change tag and digest together (tests/project/test_deploy_files.py checks both are present).
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime@sha256:7b324d212a4450795b49edba9949b7cdc72429148a64e974334bfe5774d51385

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Fail the build, not the first job, if the base is not what amptrain needs.
RUN python -c "import sys, torch; assert sys.version_info >= (3, 11), sys.version; assert torch.__version__.startswith('2.9.'), torch.__version__"

WORKDIR /opt/amptrain
COPY pyproject.toml README* ./
COPY amptrain ./amptrain

# Only the worker's needs (no FastAPI/uvicorn). torch, with its CUDA, cuDNN and NCCL, comes
# from the base image: the constraint pins pip to that exact build, so the resolver can keep
# it but never swap in a PyPI wheel; the check after the install proves it did not.
RUN python -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > /tmp/torch-constraint.txt \
    && torch_before="$(cat /tmp/torch-constraint.txt)" \
    && pip install --no-cache-dir --constraint /tmp/torch-constraint.txt ".[worker]" \
    && python -c "import importlib.metadata as m, sys; v = 'torch==' + m.version('torch'); sys.exit(0 if v == '${torch_before}' else 'torch was replaced: ' + v)" \
    && python -c "import amptrain.worker.main.devices, amptrain.worker.pool.tasks, torchvision, timm, transformers" \
    && rm /tmp/torch-constraint.txt

# Never root at run time. Numeric ids so Kubernetes can verify runAsNonRoot.
RUN groupadd --gid 10001 amptrain \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /data --shell /usr/sbin/nologin amptrain \
    && mkdir -p /data /checkpoints \
    && chown 10001:10001 /data /checkpoints
USER 10001:10001
ENV AMPTRAIN_DATA_DIR=/data \
    AMPTRAIN_CHECKPOINT_URL=/checkpoints \
    HOME=/data

# The worker's Prometheus endpoint (AMPTRAIN_WORKER_METRICS_PORT).
EXPOSE 9808

# One Celery pool process per GPU this container sees (NVIDIA_VISIBLE_DEVICES from the
# container runtime, or CUDA_VISIBLE_DEVICES); `-Q gpu-a100` etc. come as arguments.
ENTRYPOINT ["amptrain", "worker"]
