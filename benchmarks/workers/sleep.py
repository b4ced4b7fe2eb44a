"""Stay alive for argv[1] seconds (default 1): keeps the agent in its steady state for RSS."""

import sys
import time

time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
