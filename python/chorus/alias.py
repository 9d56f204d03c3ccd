"""Makes other frameworks' names resolve to chorus in this Python environment, for
code chorus does not own (Transformers, Accelerate, Lightning, Horovod's own
programs and tests):

    python -m chorus.alias install deepspeed horovod   # packages and their commands
    python -m chorus.alias uninstall deepspeed horovod
    python -m chorus.alias status

A package alias writes two things into site-packages: a package whose import
hands over to chorus (every `deepspeed.x.y` is the module `chorus.deepspeed.x.y`,
every `horovod.x.y` is `chorus.x.y`: the same objects), and a `<name>-<version>.dist-info`
that importlib.metadata and pip find. It refuses when the real package is
installed there: an alias never shadows what the user did not ask to replace.
A command alias (`horovodrun`, `deepspeed`) is chorusrun beside the
environment's other scripts. `activate(name)` aliases one process only.
"""
import argparse
import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import sysconfig

MARKER = "chorus-alias"
_OLD_MARKERS = ("chorus-deepspeed-alias",)  # written by earlier chorus versions
COMMAND_MARKER = "# chorus-command-alias"


def _deepspeed_version():
    from chorus.deepspeed._version import DEEPSPEED_API_VERSION
    return DEEPSPEED_API_VERSION


# name -> (the chorus package it is, the API version it claims, the command that comes with it, its title)
PACKAGES = {
    "deepspeed": ("chorus.deepspeed", _deepspeed_version, "deepspeed", "DeepSpeed"),
    "horovod": ("chorus", lambda: "0.28.1", "horovodrun", "Horovod"),
}
COMMANDS = ("horovodrun", "deepspeed")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """<name>.x.y -> <target>.x.y (the module itself, not a copy)."""

    def __init__(self, name, target):
        self.name, self.target = name, target
        self._specs = {}  # the modules' own specs while importlib sets the alias's

    def _real(self, fullname):
        return self.target + fullname[len(self.name):]

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.name + "."):
            return None
        if importlib.util.find_spec(self._real(fullname)) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(self._real(spec.name))
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # importlib gave the module the alias's spec; it keeps its own.
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__)


def activate(name):
    """Serves name.* from chorus in this process (what the installed package does at
    import; call it directly to alias one program only)."""
    target = PACKAGES[name][0]
    impl = importlib.import_module(target)
    if not any(isinstance(f, _Finder) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(name, target))
    sys.modules.setdefault(name, impl)
    return impl


def _site_packages():
    return sysconfig.get_paths()["purelib"]


def installed(name):
    """(distribution, is_ours) for the distribution `name` in this environment, or (None, False)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None, False
    text = (dist.read_text("INSTALLER") or "").strip()
    return dist, text in (MARKER,) + _OLD_MARKERS


def _write(path, text, mode=None):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    if mode:
        os.chmod(tmp, mode)
    os.replace(tmp, path)  # atomically: a half-written shim never imports


def install_package(name, site=None):
    if name not in PACKAGES:
        raise SystemExit(f"chorus.alias: '{name}' is not one of {', '.join(PACKAGES)}")
    target, version_of, _, title = PACKAGES[name]
    version = version_of()
    site = site or _site_packages()
    dist, ours = installed(name)
    if dist is not None and not ours:
        raise SystemExit(f"a real {title} {dist.version} is installed in this environment "
                         f"({dist.locate_file('')}); chorus will not shadow it. Uninstall it first "
                         f"(pip uninstall {name}) if you mean to replace it with {target}.")
    if ours:
        uninstall_package(name, site, quiet=True)
    pkg = os.path.join(site, name)
    info = os.path.join(site, f"{name}-{version}.dist-info")
    os.makedirs(pkg, exist_ok=True)
    os.makedirs(info, exist_ok=True)
    shim = (f"# {MARKER}: written by `python -m chorus.alias install {name}`.\n"
            f"# `import {name}` is {target}; remove with `python -m chorus.alias uninstall {name}`.\n"
            "import sys as _sys\n\nfrom chorus.alias import activate as _activate\n\n"
            f"_sys.modules[__name__] = _activate({name!r})\n")
    files = {
        os.path.join(pkg, "__init__.py"): shim,
        os.path.join(info, "METADATA"): (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                         f"Summary: {name}'s API served by {target} (an alias)\nRequires-Dist: chorus\n"),
        os.path.join(info, "INSTALLER"): MARKER + "\n",
        os.path.join(info, "top_level.txt"): name + "\n",
    }
    for path, text in files.items():
        _write(path, text)
    record = [os.path.relpath(p, site) + ",," for p in files] + [os.path.relpath(os.path.join(info, "RECORD"), site) + ",,"]
    _write(os.path.join(info, "RECORD"), "\n".join(record) + "\n")
    importlib.invalidate_caches()
    return pkg


def uninstall_package(name, site=None, quiet=False):
    site = site or _site_packages()
    title = PACKAGES[name][3]
    dist, ours = installed(name)
    if dist is None:
        if not quiet:
            print(f"no {name} alias is installed here")
        return False
    if not ours:
        raise SystemExit(f"the {name} in this environment is a real {title} {dist.version}, not chorus's alias; "
                         "leaving it alone")
    markers = (MARKER,) + _OLD_MARKERS
    for entry in os.listdir(site):
        if entry == name or (entry.startswith(name + "-") and entry.endswith(".dist-info")):
            path = os.path.join(site, entry)
            marker = os.path.join(path, "INSTALLER" if entry.endswith(".dist-info") else "__init__.py")
            try:
                with open(marker) as f:
                    text = f.read()
            except OSError:
                continue
            if any(m in text for m in markers):
                shutil.rmtree(path)
    importlib.invalidate_caches()
    return True


def _command_path(name, scripts=None):
    return os.path.join(scripts or sysconfig.get_paths()["scripts"], name)


def _our_command(path):
    try:
        with open(path) as f:
            return COMMAND_MARKER in f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False


def install_commands(names=COMMANDS, scripts=None):
    """`horovodrun` / `deepspeed` commands that are chorusrun (started as `deepspeed`,
    chorusrun behaves as DeepSpeed's launcher does). A command of that name that
    chorus did not write is left alone."""
    done = []
    for name in names:
        if name not in COMMANDS:
            raise SystemExit(f"chorus.alias: '{name}' is not one of {', '.join(COMMANDS)}")
        path = _command_path(name, scripts)
        if os.path.exists(path) and not _our_command(path):
            print(f"{path} exists and is not chorus's; left alone", file=sys.stderr)
            continue
        _write(path, f"#!{sys.executable}\n{COMMAND_MARKER}: `{name}` is chorusrun "
               "(remove with python -m chorus.alias uninstall)\n"
               "import sys\n\nfrom chorus._launcher import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
               mode=0o755)
        done.append(path)
    return done


def uninstall_commands(names=COMMANDS, scripts=None):
    removed = []
    for name in names:
        path = _command_path(name, scripts)
        if os.path.exists(path) and _our_command(path):
            os.remove(path)
            removed.append(path)
    return removed


def main(argv=None, prog="python -m chorus.alias", only=None):
    """install/uninstall/status of package aliases (with their commands) and command aliases."""
    choices = list(only or (list(PACKAGES) + [c for c in COMMANDS if c not in PACKAGES]))
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["install", "uninstall", "status"])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(choices)} (default: all)")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in choices:
            parser.error(f"'{name}' is not one of {', '.join(choices)}")
    names = args.names or choices
    for name in names:
        package = name in PACKAGES
        command = PACKAGES[name][2] if package else name
        if args.action == "install":
            if package:
                print(f"installed: `import {name}` is {PACKAGES[name][0]} in {install_package(name)}")
            for path in install_commands([command]):
                print(f"installed: the `{command}` command is chorusrun ({path})")
        elif args.action == "uninstall":
            if package and uninstall_package(name):
                print(f"removed the {name} alias")
            for path in uninstall_commands([command]):
                print(f"removed the `{command}` command ({path})")
        elif package:
            dist, ours = installed(name)
            print(f"{name}: " + ("not here" if dist is None else
                                 f"{dist.version}, " + ("chorus's alias" if ours else f"a real {PACKAGES[name][3]}")))
        else:
            path = _command_path(name)
            print(f"{name}: " + ("chorus's command" if _our_command(path) else
                                 "another program's" if os.path.exists(path) else "not here"))


if __name__ == "__main__":
    main()
