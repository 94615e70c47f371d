"""Load tier: bench/load.py against real servers on 127.0.0.1."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
