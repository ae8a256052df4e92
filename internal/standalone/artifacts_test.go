package standalone_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// TestArtifactsGoWithTheirWorkflowRun: stoke up keeps artifacts in its data
// directory, serves them by the WorkflowRun's name, and its sweep deletes
// them once the WorkflowRun is gone.
func TestArtifactsGoWithTheirWorkflowRun(t *testing.T) {
	p := start(t, runtimeOf("bash", 1, 2))
	ctx := context.Background()
	wf, err := p.Store().WorkflowRuns().Create(ctx, &v1alpha1.WorkflowRun{ObjectMeta: metav1.ObjectMeta{Name: "ci", Namespace: "default"},
		Spec: v1alpha1.WorkflowRunSpec{Jobs: []v1alpha1.Job{{ID: "build", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: "true"}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	_ = tw.WriteHeader(&tar.Header{Name: "a.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	_, _ = tw.Write([]byte("a"))
	_ = tw.Close()
	run := artifact.Run{Namespace: "default", UID: string(wf.UID), Name: "ci"}
	if _, err := p.ArtifactMover().Store().Put(ctx, run, "dist", &b); err != nil {
		t.Fatal(err)
	}
	if items, err := p.ArtifactReader().ListArtifacts(ctx, "default", "ci"); err != nil || len(items) != 1 || items[0].Name != "dist" {
		t.Fatalf("list: %+v %v", items, err)
	}
	dir := filepath.Join(p.dataDir, "artifacts", "default", string(wf.UID))
	if res, err := p.SweepArtifacts(ctx); err != nil || res != (artifact.SweepResult{}) {
		t.Fatalf("a sweep with the WorkflowRun there: %+v %v", res, err)
	}
	if err := p.Store().WorkflowRuns().Delete(ctx, "default", "ci", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := p.SweepArtifacts(ctx); err != nil || res.Runs != 1 {
		t.Fatalf("a sweep after its delete: %+v %v", res, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("its artifacts' directory: %v", err)
	}
	if _, err := p.ArtifactReader().ListArtifacts(ctx, "default", "ci"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("list after the delete: %v", err)
	}
}
