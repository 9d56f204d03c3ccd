"""Makes `import deepspeed` resolve to chorus.deepspeed in this Python environment
(chorus.alias does the work; this is its DeepSpeed-only entry point):

    python -m chorus.deepspeed.alias install      # once per environment
    python -m chorus.deepspeed.alias uninstall    # (or: pip uninstall deepspeed)
    python -m chorus.deepspeed.alias status
"""
from chorus import alias as _alias


def activate():
    """Serves deepspeed.* from chorus.deepspeed in this process."""
    return _alias.activate("deepspeed")


def install(site=None):
    return _alias.install_package("deepspeed", site)


def uninstall(site=None, quiet=False):
    return _alias.uninstall_package("deepspeed", site, quiet)


def main(argv=None):
    _alias.main(argv, prog="python -m chorus.deepspeed.alias", only=["deepspeed"])


if __name__ == "__main__":
    main()
