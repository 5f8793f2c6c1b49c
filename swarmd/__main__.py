"""`python -m swarmd --config PEER.json [--verbose]`: run one swarm daemon in the foreground.

The daemon's own entry point (swarmd never imports the `blocktrain` CLI): reads a DaemonConfig
serialised with DaemonConfig.to_dict as JSON and runs it with swarmd.node.runner, which prints
the same stdout lines as `blocktrain run` (LocalSwarm spawns peers this way). Errors print one
`error: ...` line on stderr and exit non-zero (2 for a bad config), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from swarmd.errors import ConfigError, SwarmdError
from swarmd.node.config import DaemonConfig
from swarmd.node.runner import end_process_after_shutdown, run_foreground, setup_logging


def load_config(path: Path) -> DaemonConfig:
    """The DaemonConfig in a JSON file (ConfigError if unreadable or invalid)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read daemon config {path}: {exc}") from None
    return DaemonConfig.from_dict(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swarmd", description="Run one BlockTrain swarm daemon.")
    parser.add_argument("--config", type=Path, required=True, help="DaemonConfig as JSON (DaemonConfig.to_dict).")
    parser.add_argument("--verbose", "-v", action="store_true", help="Log every round and exchange to stderr.")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        run_foreground(load_config(args.config))
    except SwarmdError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    end_process_after_shutdown()
    sys.exit(main())
