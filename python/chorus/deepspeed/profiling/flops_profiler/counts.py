"""The counts the profiler's hooks leave on modules, summed over a subtree, and the
numbers as DeepSpeed prints them (below the profiler and its report, which both use them)."""


_DIVISORS = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "": 1, "m": 1e-3, "u": 1e-6}


def number_to_string(num, units=None, precision=2):
    """num scaled to a unit (T, G, M, K, none, m, u), rounded, as DeepSpeed prints it ("1.23 M")."""
    if units is None:
        units = next((u for u, d in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)) if num >= d), None)
        if units is None:
            units = "" if num >= 1 or num == 0 else "m" if num >= 1e-3 else "u"
    return f"{round(num / _DIVISORS.get(units, 1), precision):g} {units}"


def macs_to_string(macs, units=None, precision=2):
    return number_to_string(macs, units, precision) + "MACs"


def flops_to_string(flops, units=None, precision=2):
    return number_to_string(flops, units, precision) + "FLOPS"


def duration_to_string(duration, units=None, precision=2):
    return number_to_string(duration, units, precision) + "s"


def params_to_string(params, units=None, precision=2):
    units = "G" if units == "B" else units
    return number_to_string(params, units, precision).replace("G", "B").strip()


def get_module_flops(module):
    return sum(m.__flops__ for m in module.modules())


def get_module_macs(module):
    return sum(m.__macs__ for m in module.modules())


def get_module_duration(module):
    if module.__duration__ != 0:
        return module.__duration__
    return sum(get_module_duration(child) for child in module.children())
