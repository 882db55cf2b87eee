# CPU image of the retrieval service, usable as a SkyServe replica image (`image_id: docker:<your-registry>/
# searchrl-retrieval:<tag>`) or on its own. A replica that starts from it skips the pip installs (torch CPU
# and the retrieval extra, minutes per replica) and already holds the bundled corpus with its BM25 index.
# Large indexes (wiki-18) do not belong in an image: mount them from a bucket (docs/deploy.md).
#
#   docker build -f docker/retrieval.Dockerfile -t searchrl-retrieval:0.1.0 .
#   docker run --rm -p 8000:8000 -e RETRIEVAL_API_KEY searchrl-retrieval:0.1.0
#   docker build -f docker/retrieval.Dockerfile --target sky -t searchrl-retrieval:0.1.0-sky .   # for image_id
#
# Two targets. The default (last) stage runs the service as an unprivileged user, for `docker run` and
# Kubernetes. SkyPilot cannot use it as `image_id`: its container runtime (sky/provision/docker_utils.py) runs
# apt-get and sshd as root, then SSHes in as the image's default user with keys written to that user's ~, and its
# bucket mounts need FUSE; so the `sky` stage keeps root as the default user, as the images SkyPilot documents do.
#
# Linted by hadolint in the test suite (tests/test_dockerfile.py). Not built on the project's CI machines
# (no container registry is reachable there).
FROM python:3.11-slim-bookworm AS base

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SEARCHRL_RETRIEVAL_DATA_DIR=/data \
    SEARCHRL_RETRIEVAL_HOST=0.0.0.0 \
    SEARCHRL_RETRIEVAL_PORT=8000

WORKDIR /opt/searchrl

# torch first and alone, from the CPU index: PyPI's Linux wheel of the same version is the multi-GB CUDA build.
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY searchrl ./searchrl
COPY retrieval ./retrieval
COPY trainer ./trainer
COPY infer ./infer
# DL3013 asks for pins: this installs the checkout itself, whose dependencies pyproject.toml bounds. Then the
# bundled corpus and its BM25 index, built once at image build time (about a second).
# hadolint ignore=DL3013
RUN pip install ".[retrieval]" \
    && searchrl index build --backend bm25 --corpus bundled --data-dir /data
EXPOSE 8000

# SkyPilot's `image_id` (--target sky): root by default, see the header. SkyPilot starts it with its own
# entrypoint and runs sky/retrieval.yaml's setup and run, which find searchrl on PATH and skip the installs.
FROM base AS sky

# The service image (default target): not root.
FROM base AS service
RUN useradd --system --uid 10001 --home-dir /nonexistent searchrl \
    && chown -R searchrl /data
USER 10001
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
# A public bind needs RETRIEVAL_API_KEY (docker run -e RETRIEVAL_API_KEY ...); the service refuses otherwise.
ENTRYPOINT ["searchrl", "serve"]
