"""Runnable examples: ``mpiexec -n N python -m mpicoll.examples.<name>``.

- ``quickstart``: every collective once, each rank's input and result in rank order.

The others (``examples/README.md`` lists them all): algorithms written by hand
(``ring_all_reduce``, ``distributed_mean``, ``distributed_argmax``,
``distributed_softmax``), torch.distributed's code through ``mpicoll.dist``
(``dist_tutorial``, ``zero_step``), and workloads (``data_parallel``,
``tensor_parallel_mlp``, ``mesh_mlp``, ``moe_all_to_all``, ``pipeline_parallel``);
``cheatsheet`` draws every collective's before and after on every rank.
"""
