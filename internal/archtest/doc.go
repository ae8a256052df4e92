// Package archtest holds tests that enforce Stoke's architecture: package
// documentation, the one-way direction of imports, and docs that stay true
// to the repository (links that resolve inside it, the `make bench` list).
package archtest
