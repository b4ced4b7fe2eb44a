"""Print argv[1] numbered lines (``<rank> <i> <payload>``) in batched writes.

Batches of 100 lines per write: a pipe reader then sees chunks that end mid-line, which is
where a tee that loses or splits lines would show it.
"""

import os
import sys

count = int(sys.argv[1])
rank = os.environ["RANK"]
payload = "x" * 40
out = sys.stdout
for start in range(0, count, 100):
    out.write("".join(f"{rank} {i} {payload}\n" for i in range(start, min(start + 100, count))))
out.flush()
