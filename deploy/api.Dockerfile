# syntax=docker/dockerfile:1
# amptrain API: HTTP API, recorder, dispatcher and migrations. No torch, no CUDA.
#
# Build from the repository root:
#   docker build -f deploy/api.Dockerfile -t amptrain-api:0.1.0 .
#
# Base pinned by tag. Debian's slim tags are rebuilt for security fixes, so pin the digest
# per release instead of forever:
#   docker buildx imagetools inspect python:3.12-slim-bookworm   # then FROM python:3.12-slim-bookworm@sha256:...
FROM python:3.12-slim-bookworm

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /opt/amptrain
COPY pyproject.toml README* ./
COPY amptrain ./amptrain
COPY deploy/api-constraints.txt /tmp/api-constraints.txt

# The control plane only, at the versions the tests ran with; the build fails if anything
# pulled torch in.
RUN pip install --no-cache-dir --constraint /tmp/api-constraints.txt ".[api]" \
    && python -c "import importlib.util as u, sys; sys.exit('torch must not be in the API image' if u.find_spec('torch') else 0)" \
    && python -c "import amptrain.server.web.app" \
    && rm /tmp/api-constraints.txt

RUN groupadd --gid 10001 amptrain \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /data --shell /usr/sbin/nologin amptrain \
    && mkdir -p /data /checkpoints \
    && chown 10001:10001 /data /checkpoints
USER 10001:10001
# /checkpoints: the API lists and serves them; owned by the same uid as in the worker image so
# a shared volume first mounted by either container stays writable for the worker.
ENV AMPTRAIN_DATA_DIR=/data \
    AMPTRAIN_CHECKPOINT_URL=/checkpoints \
    HOME=/data

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

ENTRYPOINT ["amptrain"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]
