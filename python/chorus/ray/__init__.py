"""horovod.ray's names over chorus: RayExecutor (workers as actors in a placement
group), and Ray Train backends: HorovodTrainer and ChorusConfig for TorchTrainer.

    from chorus.ray import RayExecutor
    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=2, use_gpu=False)
    executor.start()
    results = executor.run(train_fn)
"""
from chorus.ray.runner import RayExecutor, WorkerError


def __getattr__(name):
    # Ray Train is imported only by those who use it.
    if name in ("HorovodTrainer", "HorovodConfig", "ChorusConfig"):
        from chorus.ray import train
        return getattr(train, name)
    if name in ("ElasticRayExecutor", "RayHostDiscovery"):
        from chorus.ray import elastic
        return getattr(elastic, name)
    raise AttributeError(f"module 'chorus.ray' has no attribute {name!r}")


__all__ = ["RayExecutor", "WorkerError", "HorovodTrainer", "HorovodConfig", "ChorusConfig", "ElasticRayExecutor",
           "RayHostDiscovery"]
