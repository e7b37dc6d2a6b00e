# nnrp-vllm-gateway: the sidecar image. Multi-stage: a builder makes a virtual environment
# holding the wheel; the runtime stage is the slim base plus that environment only.
FROM python:3.12.8-slim-bookworm AS builder
# The compiled build (gateway/compiled.py): mypyc compiles the per-event modules, which
# needs a C compiler in this stage only (the runtime stage copies the venv, no compiler).
# The compiler is the base image's Debian release's, unpinned (DL3008): a point release
# would remove the pinned version from the mirror.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    NNRP_GATEWAY_COMPILE=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py ./
COPY gateway ./gateway
COPY cli ./cli
COPY recipes ./recipes
# The otel extra too: traces are switched on by the chart's values (or
# NNRP_GATEWAY_OTEL_TRACES), not by a different image; nothing imports it while they are off.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir ".[otel]"

FROM python:3.12.8-slim-bookworm
LABEL org.opencontainers.image.title="nnrp-vllm-gateway" \
      org.opencontainers.image.description="Serve a co-located vLLM over NNRP/1 sessions" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NNRP_GATEWAY_LISTEN=tcp://0.0.0.0:7700 \
    NNRP_GATEWAY_ADMIN_LISTEN=0.0.0.0:9090 \
    NNRP_GATEWAY_VLLM_URL=http://127.0.0.1:8000
COPY --from=builder /opt/venv /opt/venv
# A numeric user, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
EXPOSE 7700 9090
# Slim images have no curl: the gateway checks its own admin listener. The timeout allows
# for a busy event loop (/healthz took up to 2.1 s in a saturating soak) plus CLI start-up.
HEALTHCHECK --interval=10s --timeout=10s --start-period=5s --retries=3 \
    CMD ["nnrp-gateway", "health", "--quiet"]
# Exec form: the gateway is PID 1 and handles SIGTERM itself (drain, then exit 0).
ENTRYPOINT ["nnrp-gateway", "serve"]
