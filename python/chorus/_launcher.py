"""The `chorusrun` console script: runs the launcher binary shipped in this package."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chorusrun")
    if not os.path.exists(exe):
        sys.exit(f"chorusrun: the launcher binary is missing from {os.path.dirname(exe)}; "
                 "reinstall chorus")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
