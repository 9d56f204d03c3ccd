"""chorus.ray.ElasticRayExecutor on a real Ray cluster: a node removed while the job
trains (it goes on from the last commit with the rest) and a node added (it joins)."""
import os
import threading

import pytest
import torch

import workers
from chorus.ray import ElasticRayExecutor, RayHostDiscovery
from conftest import progress_of, eventually, job_segments


def test_the_job_survives_a_removed_node_and_grows_when_one_joins(ray_cluster, tmp_path):
    cluster, nodes = ray_cluster
    progress, stop = str(tmp_path / "progress"), str(tmp_path / "stop")
    settings = ElasticRayExecutor.create_settings(min_np=1, max_np=2, elastic_timeout=60, timeout_s=30)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    outcome = {}

    def go():
        try:
            outcome["results"] = executor.run(workers.elastic_train,
                                              kwargs={"batches": 100000, "progress": progress, "stop_file": stop})
        except BaseException as e:  # noqa: BLE001 - checked below
            outcome["error"] = e

    thread = threading.Thread(target=go)
    thread.start()
    sizes_now = lambda: [size for _, size in progress_of(progress)]  # noqa: E731
    assert eventually(lambda: 2 in sizes_now()[5:], 120), sizes_now()
    cluster.remove_node(nodes[1])  # its worker dies with it
    assert eventually(lambda: 1 in sizes_now()[-5:], 120), sizes_now()
    seen = len(sizes_now())
    assert eventually(lambda: len(sizes_now()) > seen + 5, 60)  # it trains on alone
    nodes[1] = cluster.add_node(num_cpus=1)
    assert eventually(lambda: sizes_now()[-5:] == [2] * 5, 120), sizes_now()[-20:]  # the new worker joined
    open(stop, "w").close()
    thread.join(300)
    assert not thread.is_alive()
    assert "error" not in outcome, outcome.get("error")
    results = outcome["results"]
    assert [r["rank"] for r in results] == [0, 1]
    final = results[0]
    # Every committed batch counted once: the rollback went to the last commit, not to the start.
    assert len(final["sizes"]) == final["batch"]
    sizes = final["sizes"]
    first_one = sizes.index(1)
    assert 2 in sizes[:first_one] and sizes[-1] == 2, sizes
    # Replicas equal at every step (before and after each change) and at the end.
    assert final["unequal"] == [] and results[1]["unequal"] == [], (final["unequal"][:5], results[1]["unequal"][:5])
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b)
    job = executor._job_id
    assert eventually(lambda: not job_segments(job)), job_segments(job)


def test_too_few_workers_for_too_long_fails_the_job(ray_cluster):
    settings = ElasticRayExecutor.create_settings(min_np=3, max_np=3, elastic_timeout=3)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1)
    executor.start()
    with pytest.raises(RuntimeError, match="fewer than min_np 3"):
        executor.run(workers.identity, args=(0,))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_np=3 and max_np=2"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(min_np=3, max_np=2))
    with pytest.raises(ValueError, match="override_discovery=False needs settings.discovery"):
        ElasticRayExecutor(override_discovery=False)


class OneNodeOnly(RayHostDiscovery):
    """A discovery of the user's own (override_discovery=False): the first node only."""

    def find_available_hosts_and_slots(self):
        hosts = super().find_available_hosts_and_slots()
        first = sorted(hosts)[0]
        return {first: hosts[first]}


def test_a_discovery_of_the_users_own_chooses_the_hosts(ray_cluster):
    settings = ElasticRayExecutor.create_settings(min_np=1, max_np=2)
    settings.discovery = OneNodeOnly(cpus_per_slot=1)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1, override_discovery=False)
    executor.start()
    results = executor.run(workers.identity, args=(0,))
    assert [r["size"] for r in results] == [1]
