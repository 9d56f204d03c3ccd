"""horovod.spark.common.backend.SparkBackend: how an estimator runs its training
function (chorus.spark.run with these settings)."""


class SparkBackend:
    def __init__(self, num_proc=None, env=None, stdout=None, stderr=None, prefix_output_with_timestamp=False,
                 verbose=1, nics=None, start_timeout=None, **unused):
        self._num_proc = num_proc
        self._kwargs = dict(env=env, stdout=stdout, stderr=stderr, verbose=verbose, nics=nics,
                            prefix_output_with_timestamp=prefix_output_with_timestamp, start_timeout=start_timeout)

    def run(self, fn, args=(), kwargs={}, env=None):  # noqa: B006 - Horovod's signature
        from chorus.spark import run
        settings = dict(self._kwargs)
        if env:
            settings["env"] = {**(settings["env"] or {}), **env}
        return run(fn, args=args, kwargs=kwargs, num_proc=self.num_processes(), **settings)

    def num_processes(self):
        if self._num_proc:
            return self._num_proc
        from pyspark.sql import SparkSession
        return SparkSession.builder.getOrCreate().sparkContext.defaultParallelism
