# Bootstrap of Stoke's warm Bash runtime; run as
#   bash --noprofile --norc -c "$BOOTSTRAP" stoke-bash
# with FILE, FUNCTION, SCRATCH and NONCE in the environment variables
# __stoke_file, __stoke_fn, __stoke_dir and __stoke_nonce, STOKE_RUN_UID set
# too, fd 3 a status pipe to Stoke and fd 4 a control pipe from Stoke. They
# are not arguments because every user can read a process's arguments and
# only its owner its environment: FILE's path holds the Run UID.
#
# FILE (absolute, already confined to the working directory) is sourced once;
# then this shell pre-forks one child at a time. The child blocks reading a
# request number N from fd 4, reads the request file SCRATCH/req.N (the
# invocation ID, the payload and the invocation's scope, each ending in a
# NUL) and calls FUNCTION with the payload as its one argument, the scope
# in STOKE_SCOPE (see Stoke's proc.Subreaper) and its stdout on the FIFO
# SCRATCH/out.N. Request data is only ever held in variables and passed as
# an argument: it is never parsed as shell.
#
# Status lines (fd 3 while loading, then this shell's stdout), one write each:
#   ready | init source STATUS | init nofunc
#   pid PID                   a child was forked and waits for a request
#                             (written by the child itself)
#   exit PID STATUS PENDING   that child ended (Stoke then kills what is left
#                             of its process group: bash's kill of a group it
#                             just reaped costs ~0.2 ms of CPU per call);
#                             PENDING is 1 if a control line is still unread
#                             (the child died before taking a request)
# On the FIFO, right after the function's output, once the function has
# returned (through fd 6, which no redirection inside the function
# outlives), the trailer
#   \036NONCE done N PID STATUS
# That is the fast path: Stoke answers without waiting for the child's exit.
# The child exits at once, so that its exit, its reaping and the next fork
# overlap Stoke's answer (holding it back until Stoke had answered made
# calls back to back a third slower). A child that exits without a trailer
# (killed, exit, set -e) is reported by this shell.
#
# Every command on the request path costs tens of microseconds when cold, so
# the child does what it can before the request comes and runs four commands
# around the function: read, mapfile, the call and the trailer.
#
# The bootstrap's functions are defined before the handler file is sourced so
# that aliases or options the file sets cannot change how they are parsed.

__stoke_child() {
	# Announced before it can take a request: see Stoke's abort.
	builtin echo "pid $BASHPID"
	# Whatever does not depend on the request is done before it comes. The
	# handler file's options are restored (the warm shell runs without
	# them) and job control goes off again, so that the handler's
	# background jobs stay in this child's process group and one group kill
	# ends them all; under set -x that traces the few lines below. The
	# positional parameters keep the nonce, the scratch directory and the
	# function name, and the bootstrap's variables go: the handler sees the
	# state right after registration, plus __stoke_seq (the request number)
	# and MAPFILE (its invocation ID and payload).
	# Unless a request is waiting already, rehearse the request path with
	# nothing (in the warm shell's options, untraced): the pages of the
	# warm shell it writes are copied for this child (copy-on-write) now,
	# not while a request waits. Where fork is slow, so are those copies.
	if ! builtin read -t 0 -u 4; then
		__stoke_seq=0
		builtin mapfile -d '' -t -n 2 </dev/null
		{
			STOKE_INVOCATION_ID= STOKE_OUTPUTS= __stoke_rehearse "" 4<&- 5>&- 6>&-
			builtin echo -n "" >&6
		} 6>/dev/null >&6
		builtin unset -v __stoke_seq MAPFILE
	fi
	builtin set "${__stoke_setargs[@]}" -- "$__stoke_nonce" "$__stoke_dir" "$__stoke_fn"
	builtin unset -v __stoke_fn __stoke_dir __stoke_nonce __stoke_setargs __stoke_pid __stoke_rc __stoke_pending
	# A line left over from a cancelled request (or a piece of one) names
	# a request file that does not exist: skip it.
	while :; do
		IFS= builtin read -r -u 4 __stoke_seq || builtin exit 125
		builtin mapfile -d '' -t -n 3 <"$2/req.$__stoke_seq" 2>&5 && break
	done
	# The function runs with its stdout on the FIFO (fd 6, then 1) and
	# without fds 4 to 6, which come back afterwards whatever it did with
	# them; the trailer follows its output on fd 6. (No "|| exit" around
	# the call: it would turn set -e off inside the function.)
	{
		STOKE_INVOCATION_ID=${MAPFILE[0]} STOKE_SCOPE=${MAPFILE[2]:-${STOKE_SCOPE-}} STOKE_OUTPUTS=$2/outputs.$__stoke_seq "$3" "${MAPFILE[1]}" 4<&- 5>&- 6>&-
		builtin echo -n $'\036'"$1 done $__stoke_seq $BASHPID $?"$'\n' >&6
	} 6>"$2/out.$__stoke_seq" >&6
}

__stoke_rehearse() { builtin printf '%s' "$1"; }

__stoke_serve() {
	exec 5>/dev/null
	while :; do
		# Job control only while forking: it puts the child in a process
		# group of its own that Stoke can kill without touching this shell.
		set -m
		__stoke_child &
		__stoke_pid=$!
		set +m
		# stderr to /dev/null: bash reports a child killed by a signal there.
		builtin wait "$__stoke_pid" 2>&5
		__stoke_rc=$?
		builtin read -t 0 -u 4 && __stoke_pending=1 || __stoke_pending=0
		builtin echo "exit $__stoke_pid $__stoke_rc $__stoke_pending"
	done
}

# The bootstrap's own variables stay in this shell: no command inherits them.
builtin export -n __stoke_fn __stoke_dir __stoke_nonce __stoke_file
# The handler file sees no positional parameters and neither pipe; what it
# prints while it is sourced is logged.
source -- "$__stoke_file" 3>&- 4<&-
__stoke_rc=$?
builtin unset -v __stoke_file
if [[ $__stoke_rc -ne 0 ]]; then
	builtin echo "init source $__stoke_rc" >&3
	builtin exit 1
fi
# Remember the options the file set for the children, then give this shell a
# known state: a file that sets -e, -u or -x must not break or trace the loop.
IFS=: builtin read -r -a __stoke_opts <<<"$SHELLOPTS"
set +o errexit +o nounset +o pipefail +o xtrace +o verbose +o errtrace +o functrace \
	+o noclobber +o noglob +o allexport +o keyword +o posix
__stoke_setargs=(+m)
for __stoke_o in "${__stoke_opts[@]}"; do
	[[ $__stoke_o == monitor || :$SHELLOPTS: == *:$__stoke_o:* ]] || __stoke_setargs+=(-o "$__stoke_o")
done
builtin unset -v __stoke_opts __stoke_o
builtin trap - DEBUG RETURN ERR EXIT
if ! builtin declare -F -- "$__stoke_fn" >/dev/null; then
	builtin echo "init nofunc" >&3
	builtin exit 1
fi
builtin echo ready >&3
# From here on stdout is the status pipe: one less redirection per line.
exec >&3 3>&-
__stoke_serve
