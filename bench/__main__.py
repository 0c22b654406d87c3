"""python -m bench: runs every benchmark that exists, in one run."""

import sys

print("bench: no benchmark is implemented yet.")
sys.exit(2)
