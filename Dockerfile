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

# The daemon's gRPC API listens on 50051; the hivemind DHT picks its own port (printed at start).
# Mount training text at /data/train.txt and a volume for checkpoints at /data/checkpoint.
EXPOSE 50051
ENTRYPOINT ["blocktrain"]
CMD ["run", "--data", "/data/train.txt", "--listen", "0.0.0.0:50051", "--dht-host", "0.0.0.0", "--checkpoint-dir", "/data/checkpoint"]
