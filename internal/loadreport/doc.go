// Package loadreport carries the Function loads of Kubernetes mode's
// gateway replicas to the control plane's autoscaler: each gateway
// replica's dispatcher knows the in-flight and queued invocations it
// holds, and the autoscaler, in the controller, needs their sum.
//
// Each gateway replica writes one record of its own (Writer): a
// coordination.k8s.io Lease named after its Pod, labelled
// stoke.dev/gateway-load, owned by the Pod (so that it goes with it),
// whose annotation stoke.dev/function-load holds the Functions with load
// as JSON ({"namespace/name": {"i": in flight, "q": queued}}). The writes
// are bounded, never one per invocation: the record is rewritten when
// the loads it shows changed, at most once per Period (1 s); at once (at
// most every UrgentInterval among such writes, whatever the period wrote
// just before) when an invocation queues for a Function with no replica
// taking invocations, so that scale from zero does not wait out a
// period; and every Refresh (10 s) while it shows load, so
// that the reader can tell a live record from one whose gateway died
// without deleting it. A stopping gateway deletes its record.
//
// The controller reads every record with an informer (Reader): a
// Function's load is the sum over the records still fresh (seen to
// change within their leaseDurationSeconds, on the reader's own clock),
// and each change of a Function's entry is passed on (OnChange: the
// autoscaler's Poke).
//
// Why records and not scraping the gateways' /metrics through their
// EndpointSlices, as Knative's autoscaler scrapes its activators: the
// API server is the one party both already reach, authenticated and
// authorized by RBAC, so the controller needs no network path to the
// gateway Pods, no credential for their metrics and no list of their
// addresses; a gateway that queues an invocation of an idle Function
// pushes it at once instead of waiting for the next scrape; and the
// writes stay bounded by the rules above (docs/functions.md).
package loadreport
