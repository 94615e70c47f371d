#!/usr/bin/env bash
# The eval node for real, by hand (too long for CI): builds the images from docker/*.Dockerfile,
# brings up deploy/docker-compose.yml (extractor-cpu on models/tiny-qwen3, scorer, Prometheus),
# scores the held-out set through it and compares the report with the demo's, evaluates the
# dashboard's queries in the stack's Prometheus, measures the images, and checks that a missing
# model mount, a wrong SPECWIRE_TARGET and a port already taken each fail clearly.
# Needs root when no Docker engine runs (dockerd is then started here and stopped by PID).
# See tests/deploy/compose_stack.py for the steps; arguments go to it (--json_out F,
# --skip_build, --work DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh  # the host's build: specwire-score and specwire-cli, the demo's report
exec .venv/bin/python tests/deploy/compose_stack.py "$@"
