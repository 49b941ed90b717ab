# A job's setup: the user's script ($5) under `sh -e`, in the job's code directory ($1), with
# the job's environment (its env.sh, $3) beside FLEET_PYTHON (the inventory's interpreter, $4,
# to make a venv from) and FLEET_UV (uv's path where the node has uv, else empty); stderr joins
# stdout. $2: the marker of the last good setup, removed first: a setup that fails half-way is
# not the last good one.
set -e
cd "$1"
rm -f "$2"
. "$3"
export FLEET_PYTHON="$4"
FLEET_UV=$(command -v uv 2>/dev/null || true)
export FLEET_UV
exec 2>&1
fleet_setup=$5
shift 5
eval "$fleet_setup"
