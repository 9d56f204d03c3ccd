"""deepspeed.sequence: Ulysses sequence parallelism over a process set."""
from chorus.deepspeed.sequence import layer  # noqa: F401
