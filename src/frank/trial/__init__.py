"""Trials: a part goes in only through a test whose rule was written (and sealed) first.

One module per job: ``model`` (the trial file), ``design`` (orders and exact tests),
``plan``, ``seal``, ``metric``, ``run``, ``results`` (the results file), ``record`` (imports
starts measured elsewhere), ``images``, ``joblogs``, ``jobs`` and ``driver`` (trials as
Kubernetes Jobs), ``decide``, ``adopt``.

May import: the root modules and every stage up to frank.ship.
"""
