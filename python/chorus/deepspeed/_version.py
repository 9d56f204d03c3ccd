# The DeepSpeed release whose API chorus.deepspeed implements (the one the peer
# benchmarks run): what `deepspeed.__version__` and the alias's distribution say.
DEEPSPEED_API_VERSION = "0.19.8"
