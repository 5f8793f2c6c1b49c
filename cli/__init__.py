"""The `blocktrain` CLI (cli.main registers the commands; each lives in its own module).

gRPC's C core logs straight to stderr (a failed bind prints its own `E... add_port.cc` line
before our one-line error): the CLI reports every gRPC failure itself, so the core's log is off
unless GRPC_VERBOSITY is set (set it to ERROR or DEBUG to see it). This must run before grpc loads.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
