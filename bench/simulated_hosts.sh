#!/bin/bash
# Runs a command as one rank of a job spread over simulated hosts on this
# machine: ranks are split into SIMULATED_HOSTS (default 2) contiguous groups,
# each with its own CHORUS_HOSTNAME, so chorus takes the hierarchical path.
#   ./build/chorusrun -np 4 bench/simulated_hosts.sh ./build/chorus-bench --coll allreduce
set -euo pipefail
hosts=${SIMULATED_HOSTS:-2}
: "${CHORUS_RANK:?run me under chorusrun}" "${CHORUS_SIZE:?run me under chorusrun}"
export CHORUS_HOSTNAME="simhost$(( CHORUS_RANK * hosts / CHORUS_SIZE ))"
exec "$@"
