package runtimed

import (
	"path/filepath"
	"strings"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// hidePaths takes the server's own paths out of what a Run's status says,
// which the Run's user reads and the server's layout is none of: a path in
// the Run's working directory becomes relative to it ("." for the
// directory itself), the pod's workspace "<workspace>", and the directory
// of the pod's socket "<pod>". A message from writing the Run's source, or
// the Runtime Server's ("mkdir /data/…/a: not a directory"), would
// otherwise name them.
func (w *worker) hidePaths(st *v1alpha1.RunStatus) {
	pod := w.d.cfg.Pod
	var pairs []string
	if dir := w.dir; pod.WorkspaceRoot != "" && dir != "" {
		pairs = append(pairs, dir+"/", "", dir, ".", pod.WorkspaceRoot, "<workspace>")
	}
	if sock, ok := strings.CutPrefix(pod.Addr, "unix://"); ok && filepath.IsAbs(sock) {
		pairs = append(pairs, filepath.Dir(sock), "<pod>")
	}
	if len(pairs) == 0 {
		return
	}
	r := strings.NewReplacer(pairs...)
	st.Message = r.Replace(st.Message)
	for i := range st.Conditions {
		st.Conditions[i].Message = r.Replace(st.Conditions[i].Message)
	}
}
