"""Standard library only: run by path from sky/*.yaml on a node before any venv exists (the NVIDIA driver check,
the stack check, the refusal record, pins.sh). Nothing here imports the searchrl package.
"""
