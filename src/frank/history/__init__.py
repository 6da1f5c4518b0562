"""A repo's past: revert, undo, the revert journal, the repository lock, diffs of locks.

One job: step a stack back or forward by editing its files, never half-way (``journal``), one
command at a time (``repolock``), and say what differs between two locks (``diff``).

May import: the root modules and every stage up to frank.assemble (and frank.audit).
"""
