"""The model and its training, with no networking (imports nothing else of swarmd but errors).

config.py      ModelConfig, TrainConfig (frozen, validated, hashable identity of a model)
model.py       DiffusionBlocks mechanics: sigma partition, EDM preconditioning, byte table,
               DenoisingBlock, block loss (and the hand-off term), Euler sampler
reference.py   E2EModel: the end-to-end reference transformer (tied or a block's table layout)
train.py       BlockTrainer (one block + byte table, trajectory inputs), E2ETrainer, lr schedule
optim.py       ReplicaAdamW: AdamW at the step size of the replicas' averaged gradient
pipeline.py    the pipelined schedule's rounds: which swarm rounds each block trains in
schedule.py    the swarm's schedules as pure rules: which blocks train, how many peers each gets
local_run.py   single-process round loop behind `blocktrain train` and the quality benchmark
balanced_rounds.py  how many local steps a peer takes a round (a faster peer fills the slowest one's round)
evaluate.py    from-noise CE with per-step trace, denoising CE, E2E CE
memory.py      parameter counts and AdamW memory accounting (`model-info`)
data.py        byte corpora, seeded batch streams, eval windows
corpus.py      WikiText-2 download cache with SHA-256 manifest
checkpoint.py  atomic safetensors checkpoints (one file per block)
files.py       atomic file writes (temp + fsync + rename), no torch
textcheck.py   is it text? binary input refused before any training, without torch or numpy
"""
