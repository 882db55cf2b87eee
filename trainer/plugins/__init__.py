"""What verl imports by name inside its Ray processes (tool, reward, agent loop, sampler, metrics, masks).

Every class here is named by a dotted string in trainer/overrides.py or the tool YAML, and loaded by verl in a
worker process: nothing here may import trainer/cpu/ or trainer/proofs/ (tests/trainer/test_rooms.py).
"""
