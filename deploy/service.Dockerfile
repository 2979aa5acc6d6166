# The decision service image: `decide serve` (and `decide eval …`) only; the engine is vLLM's own image.
# Build from the repository root:
#   docker build -f deploy/service.Dockerfile -t REGION-docker.pkg.dev/PROJECT/opendecide/service .
#   docker push REGION-docker.pkg.dev/PROJECT/opendecide/service   # prints the digest for the run file
#
# Base pinned by digest: python 3.11.10 slim (Debian bookworm), the digest recorded in nalabelle/build
# images/digests.Dockerfile. Re-pin with `docker buildx imagetools inspect python:3.11-slim-bookworm`.
FROM python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY opendecide ./opendecide
COPY service ./service
COPY readers ./readers
COPY calibration ./calibration
COPY eval ./eval
COPY deploy ./deploy
# The base package is the service against vLLM (the served model's tokenizer only: no torch). Extras the
# image's commands use: gcs for `decide eval upload` (deploy/startup.sh writes results to Cloud Storage),
# plots for `decide eval load`'s figure, postgres for the fleet's shared store (`--store postgresql://…`,
# docs/fleet.md). No local extra by default: the engine is vLLM's own image. A one-chip run that repacks
# a checkpoint (a run file's `repack = …`: deploy/startup.sh runs `decide repack` in this image) needs an
# image built with `--build-arg EXTRAS=gcs,plots,postgres,local`; torch's CPU wheel goes in first then,
# so the local extra's `torch>=2.4` pulls no CUDA build.
ARG EXTRAS=gcs,plots,postgres
RUN case ",${EXTRAS}," in *,local,*) pip install torch==2.13.0 ;; esac \
    && pip install "/src[${EXTRAS}]" && rm -rf /src

# uid 10001 is also SERVICE_UID in deploy/startup.sh: the run directory it writes to is chowned to it.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin decide
USER 10001
WORKDIR /home/decide
ENV HF_HOME=/home/decide/.cache/huggingface

EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u, urllib.error as e\ntry: u.urlopen('http://127.0.0.1:8080/v1/models', timeout=4)\nexcept e.HTTPError: pass"]
ENTRYPOINT ["decide"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
