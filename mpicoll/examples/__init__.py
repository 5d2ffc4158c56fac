"""Runnable examples: ``mpiexec -n N python -m mpicoll.examples.<name>``.

- ``quickstart``: every collective once, each rank's input and result in rank order.
"""
