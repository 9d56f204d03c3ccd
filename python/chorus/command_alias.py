"""Makes `horovodrun` and `deepspeed` commands that are chorusrun, so that command
lines from Horovod's and DeepSpeed's docs run unchanged (an opt-in; chorus.alias
does the work):

    python -m chorus.command_alias install [horovodrun] [deepspeed]
    python -m chorus.command_alias uninstall [horovodrun] [deepspeed]
"""
from chorus.alias import COMMANDS as NAMES  # noqa: F401
from chorus.alias import install_commands as install  # noqa: F401
from chorus.alias import uninstall_commands as uninstall  # noqa: F401
from chorus.alias import main as _main


def main(argv=None):
    _main(argv, prog="python -m chorus.command_alias", only=list(NAMES))


if __name__ == "__main__":
    main()
