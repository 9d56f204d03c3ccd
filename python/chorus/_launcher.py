"""The `chorusrun` console script: runs the launcher binary shipped in this package."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chorusrun")
    if not os.path.exists(exe):
        sys.exit(f"chorusrun: the launcher binary is missing from {os.path.dirname(exe)}; "
                 "reinstall chorus")
    # DeepSpeed's launcher runs a .py script with the Python it runs on; so does chorusrun.
    os.environ.setdefault("CHORUS_PYTHON", sys.executable)
    # The name it was started by (chorusrun, horovodrun, deepspeed) decides the launcher's form.
    os.execv(exe, [os.path.basename(sys.argv[0]) or exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
