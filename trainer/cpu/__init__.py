"""What a CPU run plugs into verl and a GPU run never imports: the CPU platform patches, the `hf` rollout engine
(its log lines, and the replay buffer that reads its ledgers), the gloo checkpoint engine, precision by measurement,
the tiny model, the vLLM-CPU shims and the sabotage switches.

Production code (trainer/, its plugins/, weight_sync/, patches/, node/) never imports this package:
tests/trainer/test_rooms.py reads every import and fails on a new one.
"""
