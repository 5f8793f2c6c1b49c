"""What the benchmark scripts share; nothing here imports a script (benchmarks.harness is the bottom layer).

- options.py: the parser every script starts from and the option groups they repeat (data, shape, schedule,
  training, outputs), model_of and picked (options as config fields).
- results.py: the result JSON, its command and machine lines, markdown tables and fragments, publish.
- daemons.py: the daemon swarms (LocalSwarm with hooks, tiny swarms, netns swarms) and what is read off them.
- faults.py: the fault matrix's model, row type and signed bad deltas (adversary.py and insiders.py).
- churn.py: a soak run's seeded fault schedule and the faults it injects into a LocalSwarm (soak.py).
- procs.py: samples of the daemon processes from /proc (RSS, fds, threads) and their growth (soak.py).
- rounds.py: the daemons' checkpointed round histories read as merging groups, splits and stuck rounds (soak.py).
- sweeps.py: a LocalSwarm run to its end and its readings, the simulator's text (swarm, delayed, scale, async_sim).
- cli_runs.py: a `blocktrain` command run as a process and read line by line (swarm_commands.py, bad_input.py).
"""
