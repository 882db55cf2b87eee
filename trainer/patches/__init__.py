"""Fixes to verl 0.9.1, each fenced off here with the upstream line it works around (README.md names the bug and
the pin at which the patch can go).
"""
