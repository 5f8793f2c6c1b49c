# BlockTrain daemon image (CPU by default; pass --build-arg TORCH_INDEX=... for a CUDA wheel).
#
# No compiler: every dependency installs from a wheel on python:3.11-slim (hivemind's wheel carries
# its p2pd binary); the only sdists in the tree, varint, prefetch_generator and python-baseconv,
# are pure Python (checked with `pip install --dry-run --report`).
#
# Build arguments (the defaults are what a user wants; benchmarks/docker_image.py passes the others):
#   BASE_IMAGE     any image with python3 >= 3.11 and its venv module: python:3.11-slim, or a Debian
#                  bookworm root filesystem imported with `docker import` where Docker Hub is unreachable
#   TORCH_INDEX    the index torch comes from; empty: torch from the wheel folder below (--no-index),
#                  its own dependencies from PyPI with the project's
#   TORCH_WHEELS   a folder of wheels in the build context (default `wheels`, usually absent): torch when
#                  TORCH_INDEX is empty; pip may take other wheels from it too (--find-links)
# e.g. mkdir wheels && cp torch-2.13.0+cpu-*.whl wheels/ &&
#      docker build --build-arg BASE_IMAGE=blocktrain-base:bookworm --build-arg TORCH_INDEX= -t blocktrain .
ARG BASE_IMAGE=python:3.11-slim

# the build stage: a venv at /opt/blocktrain (Debian's system pip refuses installs, PEP 668), no wheels kept
FROM ${BASE_IMAGE} AS build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_WHEELS=wheels

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/blocktrain/bin:$PATH

WORKDIR /src
# pyproject.toml makes the glob's COPY valid when the wheel folder is absent (the default)
COPY pyproject.toml ${TORCH_WHEELS}* /tmp/wheels/
RUN python3 -m venv /opt/blocktrain \
    && if [ -n "${TORCH_INDEX}" ]; then \
        pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"; \
    else \
        pip install --no-cache-dir --no-index --no-deps --find-links /tmp/wheels "torch==${TORCH_VERSION}"; \
    fi
# the dependencies first, in a layer a change of the code does not rebuild: pip needs only
# pyproject.toml and the module holding the version to resolve them (torch's own dependencies too,
# when it came from the folder without them)
COPY pyproject.toml README.md ./
COPY swarmd/__init__.py ./swarmd/
RUN pip install --no-cache-dir --find-links /tmp/wheels .
COPY swarmd ./swarmd
COPY cli ./cli
COPY proto ./proto
RUN pip install --no-cache-dir --no-deps --force-reinstall . \
    && blocktrain --help > /dev/null

# the image: the base, the venv, a user
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/blocktrain \
    PATH=/opt/blocktrain/bin:$PATH

WORKDIR /app
COPY --from=build /opt/blocktrain /opt/blocktrain
RUN groupadd --gid 10001 blocktrain \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin blocktrain \
    && mkdir -p /data/checkpoint \
    && chown -R blocktrain:blocktrain /data

# not root: uid 10001 (a bind-mounted /data must be writable by it)
USER 10001:10001

# gRPC API on 50051, the hivemind DHT on 31337 (fixed with --dht-port, so the multiaddr others join
# with survives restarts: the libp2p key lives in the checkpoint dir). Mount training text at
# /data/train.txt and keep /data/checkpoint on a volume. Other hosts must be told an address they
# can dial: publish both ports and pass the host's address, e.g.
#   docker run -p 50051:50051 -p 31337:31337 -e BLOCKTRAIN_ANNOUNCE=HOST_IP -v ./data:/data IMAGE
# (or run with --network host). Without it the daemon announces the container's own address.
EXPOSE 50051 31337
VOLUME ["/data"]

# the daemon's gRPC health service (grpc.health.v1): SERVING once it has started
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["blocktrain", "health", "127.0.0.1:50051", "--timeout-s", "5"]

ENTRYPOINT ["blocktrain"]
CMD ["run", "--data", "/data/train.txt", "--listen", "0.0.0.0:50051", "--dht-host", "0.0.0.0", "--dht-port", "31337", "--checkpoint-dir", "/data/checkpoint"]
