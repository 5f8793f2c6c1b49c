"""Programs built on the node: local swarms, the demo, the live dashboard and swarm surveys.

launch.py     LocalSwarm: N daemon processes on loopback (demo, benchmarks, tests)
demo.py       plan_demo / run_demo: a LocalSwarm, its progress as events, the model it keeps (`blocktrain demo`)
survey.py     status of one peer or a whole swarm; config fetch for `join` (no torch)
dashboard.py  `blocktrain dashboard`: the live web swarm map (dashboard.html) and its /api/swarm JSON
"""
