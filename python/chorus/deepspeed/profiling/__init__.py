"""deepspeed.profiling"""
