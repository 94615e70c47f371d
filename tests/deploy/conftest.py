"""Deployment tier: the demo script end to end, the health probe the images use, the compose /
Prometheus / Grafana / Kubernetes files, and a live Prometheus scraping real services.

Binaries come from $SPECWIRE_BUILD_DIR (default <repo>/build); servers listen on 127.0.0.1 and are
stopped by PID.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
