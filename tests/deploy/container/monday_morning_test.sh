#!/usr/bin/env bash
# A department's Monday morning in containers (scripts/monday_morning.sh says what it plays): an approval, a team
# at its burst limit queueing, a critical request preempting the lowest-priority run, which yields (exit 75) and,
# restarted as a Job would, resumes bit for bit; quotad's report and status page name every team. The script
# sources lib.sh (images, labels, clean-up) and fails on any lost lease, inexact resume or unexpected exit code.
set -euo pipefail
exec bash "$(dirname "$0")/../../../scripts/monday_morning.sh"
