"""Makes `import deepspeed` resolve to chorus.deepspeed in this Python environment,
for code chorus does not own (Transformers, Accelerate, Lightning):

    python -m chorus.deepspeed.alias install      # once per environment
    python -m chorus.deepspeed.alias uninstall    # (or: pip uninstall deepspeed)
    python -m chorus.deepspeed.alias status

install writes two things into site-packages: a `deepspeed` package whose
import hands over to chorus.deepspeed (every `deepspeed.x.y` is the module
`chorus.deepspeed.x.y`, the same object), and a `deepspeed-<version>.dist-info`
that importlib.metadata and pip find, with the DeepSpeed API version chorus
implements. It refuses when a real DeepSpeed is installed there: the alias never
shadows a DeepSpeed the user did not ask to replace.
"""
import argparse
import importlib.abc
import importlib.metadata
import importlib.util
import os
import sys
import sysconfig

from chorus.deepspeed._version import DEEPSPEED_API_VERSION
MARKER = "chorus-deepspeed-alias"

SHIM = f'''# {MARKER}: written by `python -m chorus.deepspeed.alias install`.
# `import deepspeed` is chorus.deepspeed; remove with `python -m chorus.deepspeed.alias uninstall`.
import sys as _sys

import chorus.deepspeed as _impl
from chorus.deepspeed.alias import activate as _activate

_activate()
_sys.modules[__name__] = _impl
'''


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """deepspeed.x.y -> chorus.deepspeed.x.y (the module itself, not a copy)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("deepspeed."):
            return None
        if importlib.util.find_spec("chorus." + fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def __init__(self):
        self._specs = {}  # the modules' own specs while importlib sets the alias's

    def create_module(self, spec):
        module = importlib.import_module("chorus." + spec.name)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # importlib gave the module the alias's spec; it keeps its own.
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def activate():
    """Serves deepspeed.* from chorus.deepspeed in this process (what the installed
    shim does at `import deepspeed`; call it directly to alias one program only)."""
    import chorus.deepspeed as impl
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    sys.modules.setdefault("deepspeed", impl)


def _site_packages():
    return sysconfig.get_paths()["purelib"]


def _installed():
    """(distribution, is_ours) for the 'deepspeed' distribution in site-packages, or (None, False)."""
    try:
        dist = importlib.metadata.distribution("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None, False
    files = dist.read_text("INSTALLER") or ""
    return dist, files.strip() == MARKER


def install(site=None):
    site = site or _site_packages()
    dist, ours = _installed()
    if dist is not None and not ours:
        raise SystemExit(f"a real DeepSpeed {dist.version} is installed in this environment "
                         f"({dist.locate_file('')}); chorus will not shadow it. Uninstall it first "
                         "(pip uninstall deepspeed) if you mean to replace it with chorus.deepspeed.")
    if ours:
        uninstall(site, quiet=True)
    pkg = os.path.join(site, "deepspeed")
    info = os.path.join(site, f"deepspeed-{DEEPSPEED_API_VERSION}.dist-info")
    os.makedirs(pkg, exist_ok=True)
    os.makedirs(info, exist_ok=True)
    files = {
        os.path.join(pkg, "__init__.py"): SHIM,
        os.path.join(info, "METADATA"): (f"Metadata-Version: 2.1\nName: deepspeed\nVersion: {DEEPSPEED_API_VERSION}\n"
                                         "Summary: DeepSpeed's API served by chorus.deepspeed (an alias)\n"
                                         "Requires-Dist: chorus\n"),
        os.path.join(info, "INSTALLER"): MARKER + "\n",
        os.path.join(info, "top_level.txt"): "deepspeed\n",
    }
    for path, text in files.items():
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # atomically: a half-written shim never imports
    record = [os.path.relpath(p, site) + ",," for p in files] + [os.path.relpath(os.path.join(info, "RECORD"), site) + ",,"]
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("\n".join(record) + "\n")
    importlib.invalidate_caches()
    return pkg


def uninstall(site=None, quiet=False):
    site = site or _site_packages()
    dist, ours = _installed()
    if dist is None:
        if not quiet:
            print("no deepspeed alias is installed here")
        return False
    if not ours:
        raise SystemExit(f"the deepspeed in this environment is a real DeepSpeed {dist.version}, not chorus's alias; "
                         "leaving it alone")
    import shutil
    for name in os.listdir(site):
        if name == "deepspeed" or (name.startswith("deepspeed-") and name.endswith(".dist-info")):
            path = os.path.join(site, name)
            marker = os.path.join(path, "INSTALLER") if name.endswith(".dist-info") else os.path.join(path, "__init__.py")
            with open(marker) as f:
                if MARKER in f.read():
                    shutil.rmtree(path)
    importlib.invalidate_caches()
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m chorus.deepspeed.alias",
                                     description="make `import deepspeed` resolve to chorus.deepspeed")
    parser.add_argument("action", choices=["install", "uninstall", "status"])
    args = parser.parse_args(argv)
    if args.action == "install":
        print(f"installed: `import deepspeed` is chorus.deepspeed (DeepSpeed API {DEEPSPEED_API_VERSION}) in "
              f"{install()}")
        from chorus import command_alias  # and the `deepspeed` command, as DeepSpeed's package has it
        for path in command_alias.install(["deepspeed"]):
            print(f"installed: the `deepspeed` command is chorusrun ({path})")
    elif args.action == "uninstall":
        if uninstall():
            print("removed the deepspeed alias")
        from chorus import command_alias
        command_alias.uninstall(["deepspeed"])
    else:
        dist, ours = _installed()
        if dist is None:
            print("no deepspeed here")
        else:
            print(f"deepspeed {dist.version}: " + ("chorus's alias" if ours else "a real DeepSpeed"))


if __name__ == "__main__":
    main()
