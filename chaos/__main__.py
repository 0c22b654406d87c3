"""python -m chaos: no scenario is built yet; say so rather than pretend."""

import sys

print("chaos: no scenarios are implemented yet; the runner arrives with the chaos-suite issue.")
sys.exit(2)
