package runtime

import "strings"

// RegistrationStates counts the registrations in the table by state
// ("registering", "ready", "draining", "failed"), for metrics. Every state
// is present, zero or not.
func (f *Functions) RegistrationStates() map[string]int {
	f.mu.Lock()
	regs := make([]*registration, 0, len(f.regs))
	for _, r := range f.regs {
		regs = append(regs, r)
	}
	f.mu.Unlock()
	counts := map[string]int{"registering": 0, "ready": 0, "draining": 0, "failed": 0}
	for _, r := range regs {
		state, _ := r.snapshot()
		counts[strings.ToLower(stateName(state))]++
	}
	return counts
}
