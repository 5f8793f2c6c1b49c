"""Checkpoints: a directory of safetensors files plus a JSON config, every file written atomically.

Layout of a checkpoint directory:
  config.json              format tag, model config (+hash), train config, kind, progress counters
  embedding.safetensors    the shared byte table
  block_NNN.safetensors    one file per block (metadata: config hash, block index, step)
  optim_block_NNN.safetensors  optional AdamW state of a worker, for exact resume
  e2e.safetensors          the end-to-end reference model (kind "e2e")
Every write goes to a temp file in the same directory, is fsynced, then renamed over the target,
so a crash never leaves a half-written file. Loading never unpickles: safetensors holds raw
tensors and string metadata only. A block file carries its config hash, so a block trained in
one run drops into another run's checkpoint of the same config and is refused otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as st_save

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.files import atomic_write_bytes
from swarmd.core.model import ByteEmbedding, DenoisingBlock, E2EModel
from swarmd.errors import CheckpointError, ConfigMismatch

FORMAT = "blocktrain-checkpoint/1"
PEER_KIND = "swarm-peer"  # config.json kind of a swarm daemon's checkpoint (one block + the byte table)


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    atomic_write_bytes(path, st_save(flat, metadata=metadata))


def load_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file missing: {path}")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        return load_file(str(path)), meta
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file unreadable: {path}: {exc}") from None


def block_file(directory: Path, block_index: int) -> Path:
    return Path(directory) / f"block_{block_index:03d}.safetensors"


def optim_file(directory: Path, block_index: int) -> Path:
    return Path(directory) / f"optim_block_{block_index:03d}.safetensors"


def write_config(
    directory: Path, model_cfg: ModelConfig, train_cfg: TrainConfig | None = None, kind: str = "blocktrain", **progress
) -> None:
    body = {
        "format": FORMAT,
        "kind": kind,
        "model": model_cfg.to_dict(),
        "config_hash": model_cfg.config_hash(),
        "train": train_cfg.to_dict() if train_cfg else None,
        **progress,
    }
    atomic_write_bytes(Path(directory) / "config.json", json.dumps(body, indent=2, sort_keys=True).encode())


def read_config(directory: Path) -> dict:
    path = Path(directory) / "config.json"
    if not Path(directory).is_dir():
        raise CheckpointError(f"checkpoint directory does not exist: {directory}")
    if not path.is_file():
        raise CheckpointError(f"not a checkpoint (no config.json): {directory}")
    try:
        body = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"config.json is not valid JSON: {path}: {exc}") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CheckpointError(f"unknown checkpoint format in {path}")
    try:
        body["model_config"] = ModelConfig.from_dict(body["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"bad model config in {path}: {exc}") from None
    return body


def peer_block(directory: str | Path, wanted: int = -1) -> int | None:
    """The block a swarm peer's checkpoint dir was training (None if there is no peer checkpoint there).

    :param wanted: the block asked for (-1 = any); ConfigMismatch if the checkpoint trains another one
    """
    if not (Path(directory) / "config.json").is_file():
        return None
    body = read_config(Path(directory))
    block = int(body["block_index"]) if body.get("kind") == PEER_KIND else None
    if block is not None and wanted >= 0 and wanted != block:
        raise ConfigMismatch(
            f"checkpoint {directory} trains block {block}, not --block {wanted}; "
            "use --block auto or another --checkpoint-dir"
        )
    return block


def save_block(
    directory: Path, cfg: ModelConfig, block_index: int, block: DenoisingBlock | dict[str, torch.Tensor], step: int = 0
) -> None:
    """Write one block file (a module or its state dict), tagged with config hash, block index and step."""
    meta = {"config_hash": cfg.config_hash(), "block_index": str(block_index), "step": str(step)}
    save_tensors(block_file(directory, block_index), _tensors(block), meta)


def load_block(directory: Path, cfg: ModelConfig, block_index: int, device: str = "cpu") -> tuple[DenoisingBlock, int]:
    """Load one block file, refusing one of another config or block index; returns (block, step)."""
    tensors, meta = load_tensors(block_file(directory, block_index))
    if meta.get("config_hash") != cfg.config_hash():
        raise CheckpointError(
            f"block {block_index} file is of another model config ({meta.get('config_hash')} != {cfg.config_hash()})"
        )
    if meta.get("block_index") != str(block_index):
        raise CheckpointError(f"block file holds block {meta.get('block_index')}, expected {block_index}")
    block = DenoisingBlock(cfg)
    _load_state(block, tensors, f"block {block_index}")
    return block.to(device), int(meta.get("step", 0))


def save_embedding(directory: Path, cfg: ModelConfig, emb: ByteEmbedding | dict[str, torch.Tensor]) -> None:
    save_tensors(Path(directory) / "embedding.safetensors", _tensors(emb), {"config_hash": cfg.config_hash()})


def load_embedding(directory: Path, cfg: ModelConfig, device: str = "cpu") -> ByteEmbedding:
    tensors, meta = load_tensors(Path(directory) / "embedding.safetensors")
    if meta.get("config_hash") != cfg.config_hash():
        raise CheckpointError("embedding file is of another model config")
    emb = ByteEmbedding(cfg)
    _load_state(emb, tensors, "embedding")
    return emb.to(device)


def _tensors(part: torch.nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return part.state_dict() if isinstance(part, torch.nn.Module) else part


def _load_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor], what: str) -> None:
    expected = module.state_dict()
    if set(tensors) != set(expected) or any(tensors[k].shape != expected[k].shape for k in expected):
        raise CheckpointError(f"{what} tensors do not match the model config")
    module.load_state_dict(tensors)


def save_optimizer(directory: Path, block_index: int, opt: torch.optim.Optimizer, step: int) -> None:
    """AdamW state as flat tensors: state.<param#>.<key>; hyperparameters live in the train config."""
    flat = {}
    for pid, st in opt.state_dict()["state"].items():
        for key, value in st.items():
            flat[f"state.{pid}.{key}"] = torch.as_tensor(value)
    save_tensors(optim_file(directory, block_index), flat, {"step": str(step)})


def load_optimizer(directory: Path, block_index: int, opt: torch.optim.Optimizer) -> bool:
    """Restore AdamW state if its file exists; returns whether it did."""
    path = optim_file(directory, block_index)
    if not path.is_file():
        return False
    tensors, _ = load_tensors(path)
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = value
    sd = opt.state_dict()
    sd["state"] = state
    try:
        opt.load_state_dict(sd)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"optimizer state does not fit block {block_index}: {exc}") from None
    return True


def save_e2e(
    directory: Path, cfg: ModelConfig, model: E2EModel, train_cfg: TrainConfig | None = None, **progress
) -> None:
    save_tensors(Path(directory) / "e2e.safetensors", model.state_dict(), {"config_hash": cfg.config_hash()})
    write_config(directory, cfg, train_cfg, kind="e2e", **progress)


def load_e2e(directory: Path, device: str = "cpu") -> E2EModel:
    body = read_config(directory)
    cfg = body["model_config"]
    tensors, _ = load_tensors(Path(directory) / "e2e.safetensors")
    model = E2EModel(cfg)
    _load_state(model, tensors, "e2e model")
    return model.to(device)


def save_model(
    directory: Path,
    cfg: ModelConfig,
    blocks: dict[int, DenoisingBlock],
    emb: ByteEmbedding,
    train_cfg: TrainConfig | None = None,
    steps: dict[int, int] | None = None,
    **progress,
) -> None:
    """Write the embedding, every given block, then config.json last (it marks the checkpoint complete)."""
    directory = Path(directory)
    save_embedding(directory, cfg, emb)
    for b, block in blocks.items():
        save_block(directory, cfg, b, block, (steps or {}).get(b, 0))
    write_config(directory, cfg, train_cfg, kind="blocktrain", **progress)


def load_model(directory: Path, device: str = "cpu") -> tuple[ModelConfig, list[DenoisingBlock], ByteEmbedding, dict]:
    """Load a full BlockTrain model (every block must be present)."""
    body = read_config(directory)
    if body.get("kind") != "blocktrain":
        raise CheckpointError(f"{directory} holds a {body.get('kind')} model, not a BlockTrain model")
    cfg = body["model_config"]
    missing = [b for b in range(cfg.blocks) if not block_file(directory, b).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {directory} lacks blocks {missing}")
    blocks = [load_block(directory, cfg, b, device)[0] for b in range(cfg.blocks)]
    return cfg, blocks, load_embedding(directory, cfg, device), body
