package scheduler

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
)

// hintTTL bounds how long a Run told of by Created is decided on before
// the informer shows it, and how long a deleted Run's UID is remembered
// against a Created that comes after its deletion.
const hintTTL = 10 * time.Second

// hints are the Runs told of by Created that the informer has not shown
// yet. They are the store's own answer to their create, so deciding on one
// is deciding on a version the informer would deliver; the informer stays
// the truth: a hint goes as soon as it shows anything of the Run's name.
type hints struct {
	mu   sync.Mutex
	runs map[informer.Key]hint
	// gone, and goneOld before it, are the UIDs of the Runs the informer
	// saw deleted lately: a Created that comes after both the Run's
	// create and its delete reached the informer must not bring it back.
	// The two generations swap every hintTTL, so the memory is bounded.
	gone, goneOld map[types.UID]struct{}
	swapped       time.Time
}

type hint struct {
	run *v1alpha1.Run
	at  time.Time
}

// Created tells the scheduler of a Run this process has just created,
// as the store's create returned it (the Function controller's replica,
// which a scale from zero waits for), so that it is decided at once
// rather than when the informer's watch delivers it: one watch delivery
// less between a replica's create and its assignment. The assignment is
// written as any is, on that version, and a conflict sends the Run back
// to the informer's copy. A Run the informer already shows, or saw
// deleted, is ignored. It never blocks and may be called from any
// goroutine.
func (s *Scheduler) Created(run *v1alpha1.Run) {
	if run == nil || run.Status.Phase != "" || run.DeletionTimestamp != nil {
		return
	}
	k := informer.KeyOf(run)
	now := s.clk.Now()
	h := &s.hints
	h.mu.Lock()
	_, gone := h.gone[run.UID]
	_, goneOld := h.goneOld[run.UID]
	_, shown := s.cfg.RunInformer.Get(k.Namespace, k.Name)
	if !gone && !goneOld && !shown {
		if h.runs == nil {
			h.runs = map[informer.Key]hint{}
		}
		h.runs[k] = hint{run: run, at: now}
	}
	h.mu.Unlock()
	if !gone && !goneOld && !shown {
		s.loop.Add(loopKey{keyRun, k})
	}
}

// seen drops the hint of a Run the informer now shows something of; with
// deleted set it remembers the UID, for a Created that comes after. It is
// called from the informer's handlers.
func (s *Scheduler) seen(run *v1alpha1.Run, deleted bool) {
	h := &s.hints
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.runs, informer.KeyOf(run))
	if !deleted {
		return
	}
	now := s.clk.Now()
	if h.gone == nil || now.Sub(h.swapped) > hintTTL {
		h.goneOld, h.gone, h.swapped = h.gone, map[types.UID]struct{}{}, now
	}
	h.gone[run.UID] = struct{}{}
}

// get is the Run at k as the scheduler decides on it: the informer's copy,
// or, until the informer shows it, the one Created told of.
func (s *Scheduler) get(k informer.Key) (*v1alpha1.Run, bool) {
	if run, ok := s.cfg.RunInformer.Get(k.Namespace, k.Name); ok {
		return run, true
	}
	h := &s.hints
	h.mu.Lock()
	defer h.mu.Unlock()
	hn, ok := h.runs[k]
	if !ok {
		return nil, false
	}
	if s.clk.Since(hn.at) > hintTTL {
		delete(h.runs, k)
		return nil, false
	}
	return hn.run, true
}

// dropHint forgets the hint of the Run at k with this UID (its write found
// it gone).
func (s *Scheduler) dropHint(k informer.Key, uid types.UID) {
	h := &s.hints
	h.mu.Lock()
	defer h.mu.Unlock()
	if hn, ok := h.runs[k]; ok && hn.run.UID == uid {
		delete(h.runs, k)
	}
}
