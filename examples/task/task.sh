#!/usr/bin/env bash
# A one-shot task: greets its first argument on stdout, reports on stderr,
# leaves an output in $STOKE_OUTPUTS, and exits with $EXIT_CODE (default 0).
set -euo pipefail

name=${1:-world}
echo "${GREETING:-hello}, ${name}"
echo "task: greeted ${name}" >&2
echo "GREETED=${name}" >>"$STOKE_OUTPUTS"
exit "${EXIT_CODE:-0}"
