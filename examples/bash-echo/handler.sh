# A warm Bash function (handler handler.handle): Stoke sources this file once
# and runs handle in a fresh child of that shell per invocation. The JSON input
# is $1, stdout is the JSON output, stderr goes to the Run's log, and
# KEY=VALUE lines written to $STOKE_OUTPUTS become the invocation's outputs.

handle() {
	local input=$1
	echo "bash-echo: got ${#input} bytes" >&2
	echo "INPUT_BYTES=${#input}" >>"$STOKE_OUTPUTS"
	printf '{"echo":%s,"bytes":%d,"runtime":"bash"}\n' "$input" "${#input}"
}
