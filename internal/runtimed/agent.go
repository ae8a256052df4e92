package runtimed

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// ConditionAgentConnected is the condition of a task Run whose Runtime
// Server reaches it for exec through a reverse agent (a lambda Runtime):
// whether that agent is connected, so that stoke describe says whether an
// exec can reach the Run now.
const ConditionAgentConnected = "AgentConnected"

// The condition's reasons.
const (
	agentConnected = "Connected"
	agentWaiting   = "NotConnected"
	agentEnded     = "InvocationEnded"
)

// agentCondition sets the AgentConnected condition of r from st, a
// status whose execution is still running; it reports whether that
// changed anything. A status without agent_connected (a Runtime Server
// that needs no agent) sets nothing.
func agentCondition(r *v1alpha1.Run, st *pb.StatusResponse, now time.Time) bool {
	if st.AgentConnected == nil {
		return false
	}
	c := metav1.Condition{Type: ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: agentWaiting,
		Message: "the exec agent in the task's Lambda invocation is not connected (yet, or redialling)"}
	if st.GetAgentConnected() {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, agentConnected, "the exec agent in the task's Lambda invocation is connected"
	}
	return setCondition(r, c, now)
}

// agentEnd marks the condition of a Run that had one False: its execution
// ended, and its agent with it.
func agentEnd(r *v1alpha1.Run, now time.Time) {
	if meta.FindStatusCondition(r.Status.Conditions, ConditionAgentConnected) == nil {
		return
	}
	setCondition(r, metav1.Condition{Type: ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: agentEnded,
		Message: "the task's Lambda invocation, and its exec agent, ended"}, now)
}

func setCondition(r *v1alpha1.Run, c metav1.Condition, now time.Time) bool {
	if old := meta.FindStatusCondition(r.Status.Conditions, c.Type); old != nil && old.Status == c.Status && old.Reason == c.Reason {
		return false
	}
	c.ObservedGeneration, c.LastTransitionTime = r.Generation, metav1.NewTime(now)
	return meta.SetStatusCondition(&r.Status.Conditions, c)
}

// noteAgent writes what a running execution's status says of its agent
// onto the Run, when that is news.
func (w *worker) noteAgent(ctx context.Context, st *pb.StatusResponse) {
	if st.AgentConnected == nil {
		return
	}
	now := w.d.cfg.Now()
	if run, _ := w.current(); !agentCondition(run.DeepCopy(), st, now) {
		return
	}
	if _, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool { return agentCondition(r, st, now) }); err != nil && ctx.Err() == nil {
		w.log.Warn("recording whether the exec agent is connected", "error", err)
	}
}
