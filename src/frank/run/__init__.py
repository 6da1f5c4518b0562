"""Serving an image frank built: the launcher, a container's start, supervision, signals.

One job: run what a lock describes. ``launch`` is the launcher copied into every image (and run
on the host by ``frank serve``), ``container`` starts an image through a container engine,
``supervise`` watches it (readiness, SIGTERM), ``procs`` lists a process group.

May import: the root modules and every stage up to frank.history.
"""
