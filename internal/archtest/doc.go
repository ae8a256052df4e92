// Package archtest holds tests that enforce Stoke's architecture: package
// documentation and the one-way direction of imports.
package archtest
