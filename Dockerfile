# BlockTrain daemon image (CPU by default; pass --build-arg TORCH_INDEX=... for a CUDA wheel).
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ && rm -rf /var/lib/apt/lists/*
WORKDIR /app
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
COPY pyproject.toml README.md ./
COPY swarmd ./swarmd
COPY cli ./cli
COPY proto ./proto
RUN pip install --no-cache-dir .

# gRPC (daemon API) and the hivemind DHT (libp2p) listen here.
EXPOSE 50051 31337
ENTRYPOINT ["blocktrain"]
CMD ["run", "--listen", "0.0.0.0:50051", "--dht-listen", "/ip4/0.0.0.0/tcp/31337", "--checkpoint-dir", "/data/checkpoint"]
