package docker

import (
	"slices"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// resolve finds the rule of an image reference: a Runtime of the
// namespace that names the image as what it runs (its pod template's
// image in Kubernetes, spec.lambda.image on Lambda), so that there the
// image is really what runs; else the images table.
func (s *Server) resolve(ref string) (ImageRule, string, error) {
	if rr, ok := s.cfg.Backend.(RuntimeReader); ok && ref != "" {
		n := NormalizeImage(ref)
		rts := rr.CachedRuntimes(s.cfg.Namespace)
		// The same image named twice: the oldest Runtime's, always.
		slices.SortFunc(rts, func(a, b *v1alpha1.Runtime) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
		for _, rt := range rts {
			if img := runtimeImage(rt); img != "" && NormalizeImage(img) == n {
				return runtimeRule(rt, n), n, nil
			}
		}
	}
	return s.cfg.Images.Resolve(ref)
}

// runtimeImage is the image a Runtime runs its Runs in, if it names one.
func runtimeImage(rt *v1alpha1.Runtime) string {
	switch {
	case rt.Spec.Lambda != nil:
		return rt.Spec.Lambda.Image
	case rt.Spec.Template != nil:
		return rt.Spec.Template.Image
	}
	return ""
}

// runtimeRule is the rule of the image n a Runtime runs: a python
// Runtime runs python3 ARGS, others bash.
func runtimeRule(rt *v1alpha1.Runtime, n string) ImageRule {
	inner := rt.Spec.Server
	if rt.Spec.Lambda != nil {
		inner = rt.Spec.Lambda.Runtime
	}
	if inner == "python" {
		return ImageRule{Image: n, Runtime: rt.Name, Cmd: []string{"python3"}, Interpreter: "python*"}
	}
	return ImageRule{Image: n, Runtime: rt.Name, Cmd: []string{"bash"}}
}
