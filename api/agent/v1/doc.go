// Package agentv1 holds the generated Go code for agent.v1: the control
// service of exec's reverse agent, served by the bootstrap inside a Lambda
// sandbox over the connection it dialled back. Regenerate with `make
// generate`; CI fails when the committed code is stale.
package agentv1
