"""swarmd: the BlockTrain swarm daemon and the model it trains.

Model and training (no networking):
  config.py      ModelConfig, TrainConfig (frozen, validated, hashable identity of a model)
  model.py       DiffusionBlocks mechanics: sigma partition, EDM preconditioning, byte table,
                 DenoisingBlock, block loss, Euler sampler, E2E reference transformer
  train.py       BlockTrainer (one block + byte table, trajectory inputs), E2ETrainer, lr schedule
  local_run.py   single-process round loop behind `blocktrain train` and the quality benchmark
  evaluate.py    from-noise CE with per-step trace, denoising CE, E2E CE
  memory.py      parameter counts and AdamW memory accounting (`model-info`)
  data.py        byte corpora, seeded batch streams, eval windows
  corpus.py      WikiText-2 download cache with SHA-256 manifest
  checkpoint.py  atomic safetensors checkpoints (one file per block)
Swarm:
  peer_config.py DaemonConfig, GossipConfig, NetConfig
  wire.py        raw tensor bytes <-> swarmd.v1.Tensor, zstd with size guards, validation
  delta.py       delta codecs (fp32/fp16/bf16/int8 + zstd), error feedback, chunked payloads
  transport/     grpc.aio server (health, reflection) and PeerClient
  discovery.py   hivemind DHT / static peer discovery, block choice
  state.py       BlockState: weights + AdamW under one lock, hashes, count-sketch
  gossip.py      one averaging round: exchange, validate, deadline, merge, re-sync
  metrics.py     throughput EMA, byte counters, participation, round history
  daemon.py      Daemon: wires the pieces, owns the asyncio tasks and the training thread
  survey.py      status of one peer or a whole swarm; config fetch for `join`
  launch.py      LocalSwarm: N `blocktrain run` processes on loopback (demo, benchmarks)
Inference:
  inference.py   local one-sweep scoring and cached byte-by-byte generation
  serving.py     BlockServing: the Forward RPC's block step with per-session KV caches
  remote.py      swarm client: block routing by latency, sessions, failover
v1/              generated gRPC stubs of proto/swarmd/v1/swarm.proto (never edited by hand)
"""

__version__ = "0.1.0"
