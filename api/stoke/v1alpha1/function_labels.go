package v1alpha1

// The marks a Function's controller puts on its replica Runs, which the
// gateway's dispatcher reads: membership by label (so a selector finds a
// Function's replicas), draining by annotation (it changes during a
// replica's life and selects nothing).
const (
	// LabelFunction is the name of the Function a replica Run belongs to,
	// in the Run's namespace.
	LabelFunction = "stoke.dev/function"
	// AnnotationDraining, set to "true" on a replica Run, tells the
	// dispatcher to give it no new invocation; the one in flight ends
	// normally. The controller deletes the Run once the dispatcher's
	// in-flight count for it is zero (or after its drain bound).
	AnnotationDraining = "stoke.dev/draining"
)
