"""Where things are: the checkout, the console scripts of this interpreter, the test scripts."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SCRIPTS = TESTS / "scripts"
FIXTURES = TESTS / "fixtures"
EXAMPLES = REPO / "examples"
TRAIN = EXAMPLES / "train_ddp.py"
PY = sys.executable
# The console scripts installed next to this interpreter (the project's venv).
XRUN = str(Path(sys.executable).with_name("xrun"))
XRUN_AGENT = str(Path(sys.executable).with_name("xrun-agent"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
