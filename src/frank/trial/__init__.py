"""Trials: a part goes in only through a test whose rule was written (and sealed) first.

One module per job: ``model`` (the trial file), ``design`` (orders and exact tests),
``plan``, ``seal``, ``metric``, ``run``, ``record``, ``decide``, ``adopt``.
"""
