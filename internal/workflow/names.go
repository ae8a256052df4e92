package workflow

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Labels on a step Run: which WorkflowRun, job and step it is, so that a
// selector finds them (stoke get runs -l stoke.dev/workflowrun=NAME).
const (
	LabelWorkflowRun = "stoke.dev/workflowrun"
	LabelJob         = "stoke.dev/job"
	LabelStep        = "stoke.dev/step"
)

// maxRunName is a Run name's bound (a DNS-1123 subdomain); names stay far
// shorter, for `stoke get runs`.
const maxRunName = 120

// stepRunName is the name of the step Run of (job instance, attempt,
// step) of the WorkflowRun with uid: readable (the WorkflowRun, the job
// as a DNS label, the matrix index, the attempt and the step), and made
// unique by a hash of the exact identity, since the readable part loses
// case and '_'. step -1 is the job's cleanup Run, which removes the
// workspace when its last step did not.
func stepRunName(wfName, uid, job string, index int, attempt int32, step int) string {
	s := "s" + fmt.Sprint(step)
	if step < 0 {
		s = "end"
	}
	return runName(wfName, fmt.Sprintf("%s/%s/%d/%d/%d", uid, job, index, attempt, step), job, index, attempt, s)
}

// hashRunName is the name of the hash Run of step (docs/workflows.md,
// hashFiles): as stepRunName's, its part "h<step>".
func hashRunName(wfName, uid, job string, index int, attempt int32, step int) string {
	return runName(wfName, fmt.Sprintf("%s/%s/%d/%d/%d/hash", uid, job, index, attempt, step), job, index, attempt, "h"+fmt.Sprint(step))
}

func runName(wfName, id, job string, index int, attempt int32, s string) string {
	sum := sha256.Sum256([]byte(id))
	var suffix string
	if index > 0 {
		suffix = fmt.Sprintf("-%d", index)
	}
	suffix += fmt.Sprintf("-a%d-%s-%s", attempt, s, hex.EncodeToString(sum[:3]))
	base := wfName + "-" + slug(job)
	if len(base)+len(suffix) > maxRunName {
		base = strings.TrimRight(base[:maxRunName-len(suffix)], "-.")
	}
	return base + suffix
}

// workspaceName is the workspace a job instance's attempt shares on its
// pod: a fresh one per attempt, so that a retried job starts clean.
func workspaceName(uid, job string, index int, attempt int32) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%s/%d/%d", uid, job, index, attempt))
	return "wf-" + hex.EncodeToString(sum[:12])
}

// slug is s as a DNS-1123 label fragment: lower case, '_' and '/' (a
// called job's scope) as '-', other characters dropped.
func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '_' || r == '-' || r == '/':
			b.WriteByte('-')
		}
	}
	out := strings.Trim(b.String(), "-")
	if out == "" {
		out = "job"
	}
	return out
}

// labelValue is s when it is a valid label value, else its slug (a job id
// may start with '_').
func labelValue(s string) string {
	ok := len(s) <= 63
	for i, r := range s {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || i == len(s)-1 || !strings.ContainsRune("-_.", r)) {
			ok = false
		}
	}
	if ok {
		return s
	}
	return slug(s)
}
