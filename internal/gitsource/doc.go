// Package gitsource fetches the commit a Run's spec.source.git names into
// a cache that the pods of a Runtime share, once per commit, and resolves
// a ref to its commit. It uses the git CLI (Debian's git, on the PATH of
// the process that fetches): fetching one commit by ID with --depth=1 over
// protocol v2 and `git archive` are fast and exact there, and smart HTTP,
// git:// and their errors behave as users know them; go-git would need no
// binary but reimplements the transport and is slower on large trees.
//
// The cache holds each commit's tree as plain files under
// DIR/trees/<url key>/<commit>, made in a temporary directory and renamed
// into place, so a reader sees a whole tree or none; an flock per commit
// lets one fetch run while the others wait for it, in this process and in
// others sharing DIR. A tree's entries are checked as they are unpacked (internal/tarsafe):
// a link that points outside the tree, or a path that leaves it, fails the
// fetch, which then leaves nothing.
//
// Credentials are never in git's arguments, the cache's paths or a log:
// they reach git as an http.extraHeader in the GIT_CONFIG_* variables of
// git's own environment. git runs with no system or global configuration,
// no prompt, and only the http, https and git protocols.
package gitsource
