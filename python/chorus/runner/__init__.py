"""Starting chorus ranks from other engines' workers (Spark tasks, Ray actors).

Each rank's function runs in a child process of the engine's worker, never in the
worker itself: chorus's threads and shared memory must end with the job, and
engines reuse their workers.
"""
