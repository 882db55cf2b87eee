"""The `searchrl train cpu ...` runs that prove the GRPO loop on a CPU: train-cpu, learn, real weights, the
learning gate, their rewards and step evidence, and the benches of the CPU engines.

Only the CLI verbs that start them import this package (tests/trainer/test_rooms.py).
"""
