"""Reduce ops as every frontend names them (hvd.Average...): chorus's codes."""
import warnings

Sum = 0
Average = 1
Min = 2
Max = 3
Product = 4
Adasum = 5  # adaptive summation: floating dtypes, allreduce only


def resolve_op(op, average, where):
    """The op from Horovod's op= and deprecated average= arguments (default Average)."""
    if average is not None:
        warnings.warn("the 'average' argument is deprecated; use op=Average or op=Sum",
                      DeprecationWarning, stacklevel=3)
        if op is not None:
            raise ValueError(f"{where}: give either op or average, not both")
        op = Average if average else Sum
    if op is None:
        op = Average
    if op not in (Sum, Average, Min, Max, Product, Adasum):
        raise ValueError(f"{where}: unknown reduce op {op!r}")
    return op
