// Package e2e holds black-box tests of the stoke binary: they build it,
// run it as a user would, and talk to it with real clients (grpcurl).
package e2e
