# shellcheck shell=bash disable=SC2154,SC2034  # summary and status are the caller's
# steps.sh - sourced by the GPU scripts (run.sh, run_mp.sh, run_arena_mp.sh, run_fsdp.sh,
# run_train_example.sh, kernels_check.sh): run one named step of a script.
#
#   run_step NAME LOG LIMIT CMD...   append "== NAME: CMD" and CMD's output to LOG, run CMD
#                                    under `timeout LIMIT` (LIMIT 0: no timeout), append
#                                    "NAME PASS (Ns)" or "NAME FAIL rc=N (Ns)" to $summary
#                                    (and stdout); on a failure set status=1.  Returns CMD's
#                                    status.
#
# The caller sets summary and status, and may set:
#   step_width=N     the name column of the summary line (default 28)
#   step_echo=1      the "== NAME" line on stdout too (default: only in LOG)
#   step_kill=S      timeout's -k S: KILL a command S seconds after its TERM (default none)
#   step_budget=S    an overall budget in seconds of the script ($SECONDS): LIMIT shrinks to
#                    what is left less 3 s; under 10 s left the step is not run (a SKIPPED
#                    line, status=1, return 1)
run_step() {
    local name=$1 log=$2 limit=$3; shift 3
    if [ -n "${step_budget:-}" ]; then
        local left=$((step_budget - SECONDS - 3))
        [ "$left" -lt "$limit" ] && limit=$left
        if [ "$limit" -lt 10 ]; then
            printf "%-${step_width:-28}s SKIPPED (budget spent)\n" "$name" | tee -a "$summary"
            status=1
            return 1
        fi
        echo "== $name (limit ${limit}s): $*" >>"$log"
    elif [ "${step_echo:-0}" = 1 ]; then
        echo "== $name: $*" | tee -a "$log"
    else
        echo "== $name: $*" >>"$log"
    fi
    local t0=$SECONDS rc
    if [ "$limit" = 0 ]; then
        "$@" >>"$log" 2>&1
    else
        timeout ${step_kill:+-k "$step_kill"} "$limit" "$@" >>"$log" 2>&1
    fi
    rc=$?
    printf "%-${step_width:-28}s %s (%ds)\n" "$name" \
        "$([ $rc -eq 0 ] && echo PASS || echo "FAIL rc=$rc")" $((SECONDS - t0)) | tee -a "$summary"
    [ $rc -eq 0 ] || status=1
    return $rc
}
