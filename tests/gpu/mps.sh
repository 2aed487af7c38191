# mps.sh - sourced by tests/gpu/run.sh and run_mp.sh: run a command with a private CUDA MPS
# daemon (processes of one GPU then share its SMs instead of being time-sliced).
#
#   with_mps DIR CMD...   start `nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY and
#                         CUDA_MPS_LOG_DIRECTORY under DIR, run CMD with them exported, stop
#                         the daemon (`echo quit | nvidia-cuda-mps-control`) whatever CMD did;
#                         returns CMD's status (97: the daemon did not start, 98: MPS is not
#                         installed).
#
# The pipe directory holds a Unix socket, whose path the kernel limits to 107 bytes: a DIR
# whose pipe path would be longer gets its pipe directory under /tmp instead (said in the log).
# The daemon is this user's and only for the command's duration; nothing else changes on the
# GPU (no compute-mode change, no multicast: NCCL_NVLS_ENABLE=0 etc. stay exported).
with_mps() {
    local dir=$1; shift
    command -v nvidia-cuda-mps-control >/dev/null || { echo "with_mps: nvidia-cuda-mps-control not found"; return 98; }
    mkdir -p "$dir/log"
    local pipe="$dir/pipe"
    if [ ${#pipe} -gt 80 ]; then
        pipe=$(mktemp -d /tmp/tide-mps.XXXXXX)
        echo "with_mps: $dir/pipe is too long for a socket path; pipe directory $pipe"
    fi
    mkdir -p "$pipe"
    (
        export CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
        # The MPS server shares a fixed pool of device connections (hardware work queues)
        # among its clients: with run.sh's CUDA_DEVICE_MAX_CONNECTIONS=32 it refused the
        # clients beyond the first few processes ("Failed to accept new client. Reached
        # maximum number of device connections" in its log; the clients saw "out of memory"
        # or "busy or unavailable"), so under MPS every client keeps the default of 8.
        export CUDA_DEVICE_MAX_CONNECTIONS=${TIDE_MPS_MAX_CONNECTIONS:-8}
        nvidia-cuda-mps-control -d || { echo "with_mps: the MPS daemon did not start"; exit 97; }
        # The daemon's logs are kept as one flat file beside DIR (DIR.log): the MPS server
        # names a client it refused or a fault that took the server down only there.
        stop() {
            echo quit | nvidia-cuda-mps-control; sleep 1
            for f in "$dir"/log/*; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done >"$dir.log" 2>&1
        }
        trap stop EXIT
        echo "with_mps: daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY, log $CUDA_MPS_LOG_DIRECTORY)"
        # In the background, so that a timeout's TERM ends the command and stops the daemon
        # at once instead of after the command.
        "$@" &
        cmd=$!
        trap 'kill -TERM $cmd 2>/dev/null; exit 143' TERM INT
        wait $cmd
    )
}
