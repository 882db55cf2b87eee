"""The exact weight-sync check: the fingerprint core, the `update_weights` tap every engine shares (tap.py), and
one adapter per rollout engine (vLLM, sglang).

The trainer fingerprints what it sent, the rollout's workers what they hold; a mismatch stops the run at the
step it happens (DESIGN.md, issue 39). GPU runs import the adapters by name through trainer/overrides.py.
"""
