"""chorus: a distributed training runtime in C++ with Horovod- and DeepSpeed-compatible frontends.

Use ``import chorus.torch as hvd`` where Horovod users write ``import horovod.torch as hvd``.
"""
__version__ = "0.1.0"
