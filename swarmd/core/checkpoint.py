"""Checkpoints: a directory of safetensors files plus a JSON config, every file written atomically.

Layout of a checkpoint directory:
  config.json              format tag, model config (+hash), train config, kind, progress counters
  embedding.safetensors    the shared byte table
  block_NNN.safetensors    one file per block (metadata: config hash, block index, step)
  optim_block_NNN.safetensors  optional AdamW state of a worker, for exact resume
  e2e.safetensors          the end-to-end reference model (kind "e2e")
A swarm peer's checkpoint is one generation: its block, byte table and AdamW files go to a fresh
gen-<round>-<nonce>/ folder, then config.json (the manifest: round, counters, the folder and each
file's sha256) is flipped atomically onto it and older generations are removed. Loading verifies
every named hash first, so a generation loads whole or not at all (the optimizer can no longer be
a round ahead of the weights). Readers resolve block_file / optim_file / embedding through the
manifest; a checkpoint without one (older layout, or a full model) reads the flat files.
Stale temp files and unnamed generation folders (a crash mid-write) are removed by clean_stale.
Every write goes to a temp file in the same directory, is fsynced, then renamed over the target,
so a crash never leaves a half-written file. Loading never unpickles: safetensors holds raw
tensors and string metadata only. A block file carries its config hash, so a block trained in
one run drops into another run's checkpoint of the same config and is refused otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as st_save

from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.files import atomic_write_bytes
from swarmd.core.model import ByteEmbedding, DenoisingBlock
from swarmd.core.reference import E2EModel
from swarmd.errors import CheckpointError, ConfigMismatch

logger = logging.getLogger(__name__)

FORMAT = "blocktrain-checkpoint/1"
PEER_KIND = "swarm-peer"  # config.json kind of a swarm daemon's checkpoint (one block + the byte table)


GENERATION_PREFIX = "gen-"  # a peer checkpoint's generation folders: gen-<round>-<nonce>
EMBEDDING_FILE = "embedding.safetensors"


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> str:
    """Write tensors atomically; returns the sha256 of the bytes written."""
    flat = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    data = st_save(flat, metadata=metadata)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def _generation(directory: Path) -> Path | None:
    """The folder config.json names as the current generation (None: flat layout, or no checkpoint)."""
    path = Path(directory) / "config.json"
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    gen = body.get("generation") if isinstance(body, dict) else None
    if not isinstance(gen, str) or not gen.startswith(GENERATION_PREFIX) or "/" in gen or "\\" in gen:
        return None
    return Path(directory) / gen


def _resolve(directory: Path, name: str) -> Path:
    gen = _generation(directory)
    return (gen if gen is not None else Path(directory)) / name


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
    return _resolve(directory, f"block_{block_index:03d}.safetensors")


def optim_file(directory: Path, block_index: int) -> Path:
    return _resolve(directory, f"optim_block_{block_index:03d}.safetensors")


def embedding_file(directory: Path) -> Path:
    return _resolve(directory, EMBEDDING_FILE)


def write_config(
    directory: Path, model_cfg: ModelConfig, train_cfg: TrainConfig | None = None, kind: str = "blocktrain", **progress
) -> None:
    """config.json (atomic); a peer checkpoint's also names its generation folder and file hashes (progress)."""
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
    save_tensors(Path(directory) / EMBEDDING_FILE, _tensors(emb), {"config_hash": cfg.config_hash()})


def load_embedding(directory: Path, cfg: ModelConfig, device: str = "cpu") -> ByteEmbedding:
    tensors, meta = load_tensors(embedding_file(directory))
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


def optimizer_tensors(opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """AdamW state as flat tensors (copies): state.<param#>.<key>; hyperparameters live in the train config."""
    flat = {}
    for pid, st in opt.state_dict()["state"].items():
        for key, value in st.items():
            flat[f"state.{pid}.{key}"] = torch.as_tensor(value).detach().clone()
    return flat


def save_optimizer(directory: Path, block_index: int, opt: torch.optim.Optimizer, step: int) -> None:
    """AdamW state as flat tensors: state.<param#>.<key>; hyperparameters live in the train config."""
    save_tensors(optim_file(directory, block_index), optimizer_tensors(opt), {"step": str(step)})


def save_peer_generation(
    directory: Path,
    cfg: ModelConfig,
    block_index: int,
    block: dict[str, torch.Tensor],
    emb: dict[str, torch.Tensor],
    optim: dict[str, torch.Tensor],
    step: int,
    train_cfg: TrainConfig | None = None,
    **progress,
) -> Path:
    """One generation of a swarm peer: files into a new gen-<round>-<nonce>/, then config.json flipped onto it.

    A crash (or a failed write: OSError) before the flip leaves the previous generation current;
    clean_stale removes the leftovers. Returns the new generation folder.
    """
    directory = Path(directory)
    gen = directory / f"{GENERATION_PREFIX}{int(progress.get('round', 0)):08d}-{secrets.token_hex(3)}"
    gen.mkdir(parents=True)
    try:
        meta = {"config_hash": cfg.config_hash(), "block_index": str(block_index), "step": str(step)}
        files = {
            f"block_{block_index:03d}.safetensors": save_tensors(
                gen / f"block_{block_index:03d}.safetensors", block, meta
            ),
            EMBEDDING_FILE: save_tensors(gen / EMBEDDING_FILE, emb, {"config_hash": cfg.config_hash()}),
            f"optim_block_{block_index:03d}.safetensors": save_tensors(
                gen / f"optim_block_{block_index:03d}.safetensors", optim, {"step": str(step)}
            ),
        }
        write_config(
            directory,
            cfg,
            train_cfg,
            kind=PEER_KIND,
            block_index=block_index,
            generation=gen.name,
            files=files,
            **progress,
        )
    except BaseException:
        shutil.rmtree(gen, ignore_errors=True)
        raise
    for name in files:  # the flat files of an older layout: superseded
        (directory / name).unlink(missing_ok=True)
    clean_stale(directory)
    return gen


def verify_generation(directory: Path, body: dict) -> None:
    """CheckpointError unless every file config.json names is there with its sha256 (no manifest: nothing to check)."""
    gen, files = body.get("generation"), body.get("files")
    if gen is None:
        return
    where = _generation(directory)
    if where is None or not isinstance(files, dict) or not where.is_dir():
        raise CheckpointError(
            f"checkpoint {directory} names generation {gen!r}, which is missing; the checkpoint cannot be loaded"
        )
    for name, digest in files.items():
        try:
            actual = hashlib.sha256((where / name).read_bytes()).hexdigest()
        except OSError:
            actual = "missing"
        if actual != digest:
            raise CheckpointError(
                f"checkpoint {directory} generation {gen}: {name} is {'missing' if actual == 'missing' else 'corrupt'} "
                "(its sha256 differs from config.json); the checkpoint cannot be loaded"
            )


def clean_stale(directory: str | Path) -> list[Path]:
    """Remove temp files of interrupted writes and generation folders config.json does not name; returns them."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    current = _generation(directory)
    removed = []
    for path in directory.iterdir():
        stale_tmp = path.is_file() and path.name.startswith(".") and path.name.endswith(".tmp")
        stale_gen = path.is_dir() and path.name.startswith(GENERATION_PREFIX) and path != current
        if not (stale_tmp or stale_gen):
            continue
        try:
            shutil.rmtree(path) if stale_gen else path.unlink()
            removed.append(path)
        except OSError as exc:
            logger.warning("could not remove stale %s: %s", path, exc)
    return removed


def load_optimizer(directory: Path, block_index: int, opt: torch.optim.Optimizer) -> bool:
    """Restore AdamW state if its file exists; returns whether it did."""
    path = optim_file(directory, block_index)
    if not path.is_file():
        return False
    tensors, _ = load_tensors(path)
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        if not name.startswith("state."):
            continue  # another optimizer's state in the same file (swarmd.averaging.outer's outer.<part>.<name>)
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
    model = E2EModel(cfg, layout="block" if "table" in tensors else "tied")
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
