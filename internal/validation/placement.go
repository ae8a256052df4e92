package validation

import (
	"net/url"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// placementNameRE is a pod UID's and a workspace's syntax: one path
// element that is neither "." nor "..", so that a workspace name can only
// name a directory directly inside the pod's work root.
var placementNameRE = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]*$`)

// commitRE is a full SHA-1 or SHA-256 commit ID.
var commitRE = regexp.MustCompile(`^([0-9a-f]{40}|[0-9a-f]{64})$`)

// WorkspaceName checks spec.placement.workspace: the one rule runtimed
// applies again before it makes the directory.
func WorkspaceName(field, name string) error {
	switch {
	case len(name) > bounds.PlacementName:
		return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(name), bounds.PlacementName)
	case !placementNameRE.MatchString(name):
		return errdefs.InvalidArgument(field, "%s must match [A-Za-z0-9][-A-Za-z0-9_.]*", quote(name))
	}
	return nil
}

func validatePlacement(e *errorList, pl *v1alpha1.Placement, p *field.Path) {
	if pl == nil {
		return
	}
	if pl.PodUID != "" {
		e.addErr(WorkspaceName(p.Child("podUID").String(), pl.PodUID))
	}
	if pl.Workspace != "" {
		e.addErr(WorkspaceName(p.Child("workspace").String(), pl.Workspace))
	} else if pl.ReleaseWorkspace {
		e.add(p.Child("releaseWorkspace"), "needs a workspace")
	}
}

// GitURL checks a repository URL: http, https or git, a host, no user
// information (credentials come from a Secret or stoke up's file, never
// the spec) and nothing git would read as an option.
func GitURL(field, raw string) error {
	if raw == "" {
		return errdefs.InvalidArgument(field, "must not be empty")
	}
	if len(raw) > bounds.GitURL {
		return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(raw), bounds.GitURL)
	}
	if strings.ContainsFunc(raw, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return errdefs.InvalidArgument(field, "%s contains a space or control character", quote(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errdefs.InvalidArgument(field, "%s is not a URL: %v", quote(raw), err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "git":
		return errdefs.InvalidArgument(field, "%s: scheme must be http, https or git", quote(raw))
	case u.Host == "":
		return errdefs.InvalidArgument(field, "%s names no host", quote(raw))
	case u.User != nil || strings.Contains(raw, "@"):
		return errdefs.InvalidArgument(field, "%s: credentials do not belong in the URL (credentialsSecret, or stoke up --git-credentials)", quote(raw))
	}
	return nil
}

// GitRef checks a ref as git check-ref-format would, for the names a user
// gives: a branch, a tag, or refs/….
func GitRef(field, ref string) error {
	bad := func(why string) error {
		return errdefs.InvalidArgument(field, "%s is not a git ref: %s", quote(ref), why)
	}
	switch {
	case ref == "":
		return bad("empty")
	case len(ref) > bounds.GitRef:
		return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(ref), bounds.GitRef)
	case strings.HasPrefix(ref, "-"):
		return bad("starts with '-'")
	case strings.ContainsFunc(ref, func(r rune) bool { return r <= ' ' || r == 0x7f || strings.ContainsRune("~^:?*[\\", r) }):
		return bad("contains a space, control character or one of ~^:?*[\\")
	case strings.Contains(ref, "..") || strings.Contains(ref, "@{") || strings.Contains(ref, "//"):
		return bad("contains '..', '@{' or '//'")
	case strings.HasPrefix(ref, "/") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ".") || strings.HasSuffix(ref, ".lock") || ref == "@":
		return bad("starts or ends with '/', ends with '.' or '.lock', or is '@'")
	}
	for _, el := range strings.Split(ref, "/") {
		if strings.HasPrefix(el, ".") {
			return bad("an element starts with '.'")
		}
	}
	return nil
}

func validateGitSource(e *errorList, g *v1alpha1.GitSource, p *field.Path) {
	e.addErr(GitURL(p.Child("url").String(), g.URL))
	switch {
	case (g.Commit == "") == (g.Ref == ""):
		e.add(p, "exactly one of commit or ref must be set")
	case g.Commit != "" && !commitRE.MatchString(g.Commit):
		e.add(p.Child("commit"), "%s must be a full commit ID (40 or 64 lowercase hex digits)", quote(g.Commit))
	case g.Ref != "":
		e.addErr(GitRef(p.Child("ref").String(), g.Ref))
	}
	if g.Path != "" {
		// The working directory itself is fine here, unlike a file's path.
		if clean := strings.TrimSuffix(strings.TrimSuffix(g.Path, "/."), "/"); clean != "." {
			e.addErr(RelativePath(p.Child("path").String(), clean))
		}
	}
	if s := g.CredentialsSecret; s != "" {
		if len(s) > 253 || !dnsSubdomainRE.MatchString(s) {
			e.add(p.Child("credentialsSecret"), "%s must be a Secret's name (a DNS-1123 subdomain)", quote(s))
		}
	}
}

var dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)
