"""Stand-in for get-pip.py used by ansible-test's virtual environments.

ansible-test downloads get-pip.py from a host this machine cannot reach. This file
bootstraps pip with the standard library's ensurepip instead, then installs what
the caller asked for.
"""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
if args:
    subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
