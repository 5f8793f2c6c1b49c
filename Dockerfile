# BlockTrain daemon image (CPU by default; pass --build-arg TORCH_INDEX=... for a CUDA wheel).
#
# No compiler: every dependency installs from a wheel on python:3.11-slim (hivemind's wheel carries
# its p2pd binary); the only sdists in the tree, varint, prefetch_generator and python-baseconv,
# are pure Python (checked with `pip install --dry-run --report`).
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY swarmd ./swarmd
COPY cli ./cli
COPY proto ./proto
RUN pip install --no-cache-dir . \
    && groupadd --gid 10001 blocktrain \
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
