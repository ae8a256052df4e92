package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/utils/ptr"
)

// status computes the Pod's status as the kubelet would report it, from
// the Pod's last status old (kept for the conditions that are not the
// node's, and for transition times).
func (w *podWorker) status(old corev1.PodStatus) corev1.PodStatus {
	s := corev1.PodStatus{
		HostIP:    hostIP,
		HostIPs:   []corev1.HostIP{{IP: hostIP}},
		StartTime: old.StartTime,
		QOSClass:  old.QOSClass,
	}
	if s.StartTime == nil {
		s.StartTime = &w.startTime
	}
	if w.ip.IsValid() {
		s.PodIP = w.ip.String()
		s.PodIPs = []corev1.PodIP{{IP: s.PodIP}}
	}
	var unready []string
	var waiting, running, stopped, succeeded, failed int
	for _, c := range w.containers {
		cs := c.status()
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
		if !cs.Ready {
			unready = append(unready, c.spec.Name)
		}
		switch {
		case cs.State.Running != nil:
			running++
		case cs.State.Terminated != nil:
			stopped++
			if cs.State.Terminated.ExitCode == 0 {
				succeeded++
			} else {
				failed++
			}
		case cs.LastTerminationState.Terminated != nil:
			// Waiting to restart: counted as it last ended, as the kubelet does.
			stopped++
			if cs.LastTerminationState.Terminated.ExitCode == 0 {
				succeeded++
			} else {
				failed++
			}
		default:
			waiting++
		}
	}
	if len(w.containers) == 0 {
		// Not set up yet: every container is waiting.
		waiting = len(w.pod.Spec.Containers)
		for _, c := range w.pod.Spec.Containers {
			unready = append(unready, c.Name)
			reason, msg := "ContainerCreating", ""
			if w.setUpErr != nil {
				reason, msg = "CreateContainerConfigError", w.setUpErr.Error()
			}
			s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, Started: ptr.To(false),
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
			})
		}
	}
	// The kubelet's getPhase.
	policy := w.pod.Spec.RestartPolicy
	switch {
	case waiting > 0:
		s.Phase = corev1.PodPending
	case running > 0:
		s.Phase = corev1.PodRunning
	case stopped > 0 && policy == corev1.RestartPolicyAlways:
		s.Phase = corev1.PodRunning
	case stopped > 0 && policy == corev1.RestartPolicyOnFailure && failed > 0:
		s.Phase = corev1.PodRunning
	case stopped > 0 && failed > 0:
		s.Phase = corev1.PodFailed
	case stopped > 0:
		s.Phase = corev1.PodSucceeded
	default:
		s.Phase = corev1.PodPending
	}
	initFailed := false
	for _, c := range w.inits {
		s.InitContainerStatuses = append(s.InitContainerStatuses, c.status())
		initFailed = initFailed || (c.proc == nil && c.term != nil && c.term.ExitCode != 0 && !c.shouldRun(policy))
	}
	if initFailed { // for good: the Pod never restarts it
		s.Phase = corev1.PodFailed
	}
	if old.Phase == corev1.PodSucceeded || old.Phase == corev1.PodFailed {
		s.Phase = old.Phase // terminal phases are final
	}

	containersReady := len(unready) == 0 && len(w.containers) > 0
	cond := func(t corev1.PodConditionType, ok bool, reason, msg string) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: msg}
		if ok {
			c.Status, c.Reason, c.Message = corev1.ConditionTrue, "", ""
		}
		return c
	}
	msg := ""
	if len(unready) > 0 {
		msg = fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	}
	reason := "ContainersNotReady"
	if s.Phase == corev1.PodSucceeded || s.Phase == corev1.PodFailed {
		reason = "PodCompleted"
		containersReady = false
	}
	ready, readyReason, readyMsg := containersReady, reason, msg
	if containersReady {
		for _, g := range w.pod.Spec.ReadinessGates {
			if c := findCondition(old.Conditions, g.ConditionType); c == nil || c.Status != corev1.ConditionTrue {
				ready, readyReason = false, "ReadinessGatesNotReady"
				readyMsg = fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", g.ConditionType)
			}
		}
	}
	mine := []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, w.ready, "", ""),
		cond(corev1.PodInitialized, len(w.pod.Spec.InitContainers) == 0 || w.ready && w.initialized(), "ContainersNotInitialized", ""),
		cond(corev1.ContainersReady, containersReady, reason, msg),
		cond(corev1.PodReady, ready, readyReason, readyMsg),
	}
	now := metav1.NewTime(w.a.clock.Now())
	for _, c := range old.Conditions {
		if findCondition(mine, c.Type) == nil {
			s.Conditions = append(s.Conditions, c)
		}
	}
	for _, c := range mine {
		c.LastTransitionTime = now
		if prev := findCondition(old.Conditions, c.Type); prev != nil && prev.Status == c.Status {
			c.LastTransitionTime = prev.LastTransitionTime
		}
		s.Conditions = append(s.Conditions, c)
	}
	return s
}

func findCondition(cs []corev1.PodCondition, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}

func (c *container) status() corev1.ContainerStatus {
	cs := corev1.ContainerStatus{
		Name: c.spec.Name, Image: c.spec.Image, RestartCount: c.restartCount,
		Ready: c.proc != nil && c.ready, Started: ptr.To(c.proc != nil && c.started),
	}
	if c.binary != "" {
		cs.ImageID = "stoke-nodeagent://" + c.binary
	}
	if c.lastTerm != nil {
		cs.LastTerminationState.Terminated = c.lastTerm
	}
	switch {
	case c.proc != nil:
		cs.ContainerID = c.id()
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: c.startedAt}
		if c.spec.ReadinessProbe == nil {
			cs.Ready = c.started
		}
	case c.term != nil && !c.shouldRun(c.w.pod.Spec.RestartPolicy):
		cs.ContainerID = c.term.ContainerID
		cs.State.Terminated = c.term
	case c.term != nil:
		cs.LastTerminationState.Terminated = c.term
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %v restarting failed container=%s", c.backoff, c.spec.Name)}
	default:
		reason := c.waitingReason
		if reason == "" {
			reason = "ContainerCreating"
		}
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: c.waitingMessage}
	}
	return cs
}

// writeStatus patches the Pod's status if it differs from what was last
// written (so writes are bounded by changes), as the kubelet's status
// manager does: it reads the Pod, and patches its status with a two-way
// strategic merge patch from what it read, with the Pod's UID as a
// precondition. It returns false when the write is to be tried again.
func (w *podWorker) writeStatus(ctx context.Context) bool {
	if w.written != nil && apiequality.Semantic.DeepEqual(*w.written, w.status(w.pod.Status)) {
		return true
	}
	fresh, err := w.a.client.CoreV1().Pods(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && fresh.UID != w.uid:
		return true // gone: the informer will say so
	case err != nil:
		if ctx.Err() == nil {
			w.log.Warn("read pod for its status", "err", err)
		}
		return false
	}
	s := w.status(fresh.Status)
	oldJSON, err1 := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: w.uid}, Status: fresh.Status})
	newJSON, err2 := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: w.uid}, Status: s})
	if err1 != nil || err2 != nil {
		w.log.Error("encode pod status", "err", err1, "err2", err2)
		return true
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, corev1.Pod{})
	if err != nil {
		w.log.Error("pod status patch", "err", err)
		return true
	}
	if string(patch) != "{}" {
		// The UID in the patch is a precondition: it fails on another Pod
		// of the same name.
		patch, err = withUID(patch, w.uid)
		if err == nil {
			_, err = w.a.client.CoreV1().Pods(w.namespace).Patch(ctx, w.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		}
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("write pod status", "err", err)
			}
			return false
		}
	}
	w.written = &s
	return true
}

func withUID(patch []byte, uid types.UID) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(patch, &m); err != nil {
		return nil, err
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		m["metadata"] = meta
	}
	meta["uid"] = string(uid)
	return json.Marshal(m)
}
