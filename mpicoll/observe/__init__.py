"""Observability: what a run tells about itself, apart from the pipeline that runs it.

- ``recorder``: each Communicator's call in progress and flight recorder (its last N calls).
- ``watchdog``: timeouts, and the thread that reports and ends an overdue call.
- ``abort``: ending every rank when one fails (``abort_on_exception``).
- ``tracing``: recording a call's messages and reductions (``comm.trace()``).
- ``monitored``: ``monitored_barrier``, the barrier that names the ranks that did not come.
- ``tracefile``, ``hang``: reading traces and the hang dumps (tools, above the runtime).
"""
