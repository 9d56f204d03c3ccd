"""Makes `horovodrun` and `deepspeed` commands that are chorusrun, so that command
lines from Horovod's and DeepSpeed's docs run unchanged (an opt-in):

    python -m chorus.command_alias install [horovodrun] [deepspeed]
    python -m chorus.command_alias uninstall [horovodrun] [deepspeed]

The commands go beside this environment's other scripts. Started as `deepspeed`,
chorusrun behaves as DeepSpeed's launcher does (the script gets --local_rank=N).
A command of that name that chorus did not write is left alone.
"""
import argparse
import os
import sys
import sysconfig

NAMES = ("horovodrun", "deepspeed")
MARKER = "# chorus-command-alias"


def _path(name, scripts=None):
    return os.path.join(scripts or sysconfig.get_paths()["scripts"], name)


def _ours(path):
    try:
        with open(path) as f:
            return MARKER in f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False


def install(names=NAMES, scripts=None):
    done = []
    for name in names:
        if name not in NAMES:
            raise SystemExit(f"chorus.command_alias: '{name}' is not one of {', '.join(NAMES)}")
        path = _path(name, scripts)
        if os.path.exists(path) and not _ours(path):
            print(f"{path} exists and is not chorus's; left alone", file=sys.stderr)
            continue
        text = (f"#!{sys.executable}\n{MARKER}: `{name}` is chorusrun "
                "(remove with python -m chorus.command_alias uninstall)\n"
                "import sys\n\nfrom chorus._launcher import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        done.append(path)
    return done


def uninstall(names=NAMES, scripts=None):
    removed = []
    for name in names:
        path = _path(name, scripts)
        if os.path.exists(path) and _ours(path):
            os.remove(path)
            removed.append(path)
    return removed


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m chorus.command_alias", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["install", "uninstall"])
    ap.add_argument("names", nargs="*", default=list(NAMES))
    a = ap.parse_args(argv)
    paths = install(a.names) if a.action == "install" else uninstall(a.names)
    for p in paths:
        print(("installed " if a.action == "install" else "removed ") + p)


if __name__ == "__main__":
    main()
