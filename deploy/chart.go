package deploy

import (
	"fmt"
	"io/fs"
	"path"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/loader/archive"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
)

// ChartDir is the chart's directory under deploy/ (and in FS).
const ChartDir = "helm/stoke"

// Manifest is one rendered object of the chart and the template it came
// from (templates/gateway.yaml).
type Manifest struct {
	Template string
	Content  string
}

// Chart loads the chart from FS as `helm install deploy/helm/stoke`
// loads it from the directory.
func Chart() (*chartv2.Chart, error) {
	var files []*archive.BufferedFile
	err := fs.WalkDir(FS, ChartDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := FS.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, &archive.BufferedFile{Name: strings.TrimPrefix(p, ChartDir+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return loader.LoadFiles(files)
}

// Render renders the chart as `helm install stoke deploy/helm/stoke -n
// namespace` with values would (values.schema.json checked), without its
// CRDs (Chart().CRDObjects() has them): the objects in Helm's install
// order, an empty template's none.
func Render(namespace string, values map[string]any) ([]Manifest, error) {
	ch, err := Chart()
	if err != nil {
		return nil, err
	}
	top, err := util.ToRenderValuesWithSchemaValidation(ch, values,
		common.ReleaseOptions{Name: "stoke", Namespace: namespace, IsInstall: true, Revision: 1}, common.DefaultCapabilities, false)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	// Partials and NOTES.txt are no objects.
	for name := range files {
		if base := path.Base(name); strings.HasPrefix(base, "_") || !strings.HasSuffix(base, ".yaml") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, err
	}
	if len(hooks) > 0 {
		return nil, fmt.Errorf("the chart has %d hooks; Render renders none", len(hooks))
	}
	out := make([]Manifest, 0, len(manifests))
	for _, m := range manifests {
		out = append(out, Manifest{Template: strings.TrimPrefix(m.Name, ch.Name()+"/"), Content: m.Content})
	}
	return out, nil
}
