"""Elastic training with horovod.torch.elastic's names: run, State, ObjectState,
TorchState, ElasticSampler, HostsUpdatedInterrupt.

Under `chorusrun --min-np N --max-np M --host-discovery-script S`, workers come
and go; a function decorated with run() rolls back to the last commit when a peer
fails, re-forms the job (new ranks, new rendezvous) and goes on.
"""
from chorus.torch.elastic.runner import reset, run, set_process_sets
from chorus.torch.elastic.sampler import ElasticSampler
from chorus.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState

__all__ = ["run", "reset", "set_process_sets", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HostsUpdatedInterrupt"]
