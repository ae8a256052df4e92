package kube

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	restclientwatch "k8s.io/client-go/rest/watch"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store/storetest"
)

// watchedRun is a Succeeded task Run as a watch sends it: storetest's
// benchmark Run with the system metadata, three managedFields entries and
// a finished status.
func watchedRun(i int) *v1alpha1.Run {
	r := storetest.BenchRun("run-" + strings.Repeat("x", i%7))
	r.APIVersion, r.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.KindRun
	r.UID = "6f1e0c3a-1a2b-4c5d-8e9f-0a1b2c3d4e5f"
	r.ResourceVersion = "123456"
	r.Generation = 1
	now := metav1.NewTime(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	r.CreationTimestamp = now
	fields := metav1.NewFieldsV1(`{"f:status":{".":{},"f:assignedPod":{},"f:assignedPodUID":{},"f:attempt":{},"f:phase":{},"f:startTime":{},"f:completionTime":{},"f:exitCode":{}}}`)
	for _, m := range []string{"e2e.test", "stoke-controller", "stoke-runtimed"} {
		r.ManagedFields = append(r.ManagedFields, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: r.APIVersion, Time: &now, FieldsType: "FieldsV1", FieldsV1: fields, Subresource: "status"})
	}
	exit := int32(0)
	r.Status = v1alpha1.RunStatus{Phase: v1alpha1.PhaseSucceeded, Reason: "Succeeded", AssignedPod: "bench-bash-795b76ddf9-c5s5k",
		AssignedPodUID: "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", Attempt: 1, StartTime: &now, CompletionTime: &now, ExitCode: &exit}
	return r
}

// watchStream is n events as the API server writes a watch response.
func watchStream(t testing.TB, n int) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := range n {
		obj, err := json.Marshal(watchedRun(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Encode(metav1.WatchEvent{Type: string(watch.Modified), Object: runtime.RawExtension{Raw: obj}}); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func TestEventReader(t *testing.T) {
	stream := watchStream(t, 2)
	// A bookmark, an event whose type does not come first, and a 410.
	stream = append(stream, `{"type":"BOOKMARK","object":{"kind":"Run","apiVersion":"stoke.dev/v1alpha1","metadata":{"resourceVersion":"777"}}}
{"object":{"metadata":{"name":"late","resourceVersion":"778"}},"type":"DELETED"}
{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}
`...)
	r := newEventReader[*v1alpha1.Run](io.NopCloser(bytes.NewReader(stream)))
	newRun := func() *v1alpha1.Run { return new(v1alpha1.Run) }
	for i := range 2 {
		typ, obj, err := r.read(newRun)
		if err != nil || typ != watch.Modified {
			t.Fatalf("event %d: %s, %v", i, typ, err)
		}
		if want := watchedRun(i); obj.Name != want.Name || obj.Status.Phase != v1alpha1.PhaseSucceeded || obj.Spec.Source.Inline.Text != want.Spec.Source.Inline.Text || *obj.Status.ExitCode != 0 {
			t.Fatalf("event %d decoded as %+v", i, obj)
		}
	}
	if typ, obj, err := r.read(newRun); err != nil || typ != watch.Bookmark || obj.ResourceVersion != "777" {
		t.Fatalf("bookmark: %s %v %v", typ, obj, err)
	}
	if typ, obj, err := r.read(newRun); err != nil || typ != watch.Deleted || obj.Name != "late" {
		t.Fatalf("reordered event: %s %v %v", typ, obj, err)
	}
	if _, _, err := r.read(newRun); !apierrors.IsResourceExpired(err) {
		t.Fatalf("ERROR event: %v, want the API's 410 Expired", err)
	}
	if _, _, err := r.read(newRun); !errors.Is(err, errStreamEnded) {
		t.Fatalf("end of stream: %v", err)
	}

	r = newEventReader[*v1alpha1.Run](io.NopCloser(strings.NewReader(`{"type":"ADDED","object":{"metadata":{"name":7}}}`)))
	if _, _, err := r.read(newRun); !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("a mistyped object: %v, want ErrInternal", err)
	}
	r = newEventReader[*v1alpha1.Run](io.NopCloser(strings.NewReader(`{"type":"ADDED","object":}`)))
	if _, _, err := r.read(newRun); !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("not JSON: %v, want ErrInternal", err)
	}
	big := `{"type":"ADDED","object":{"metadata":{"name":"` + strings.Repeat("x", maxEvent) + `"}}}`
	r = newEventReader[*v1alpha1.Run](io.NopCloser(strings.NewReader(big)))
	if _, _, err := r.read(newRun); !errors.Is(err, errEventTooLarge) {
		t.Fatalf("an event past the bound: %v", err)
	}
}

// BenchmarkWatchDecode decodes a watch stream of Succeeded task Runs as
// client-go's watch does (its framer, its JSON serializer, which first
// reads each object's apiVersion and kind, and WatchEvent with a raw copy
// of the object) and as the store's eventReader does (each object decoded
// once into its type).
func BenchmarkWatchDecode(b *testing.B) {
	const n = 1000
	stream := watchStream(b, n)
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	b.Run("ClientGo", func(b *testing.B) {
		neg := runtime.NewClientNegotiator(serializer.NewCodecFactory(scheme).WithoutConversion(), v1alpha1.SchemeGroupVersion)
		objDec, streamDec, framer, err := neg.StreamDecoder(runtime.ContentTypeJSON, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(stream)))
		for b.Loop() {
			d := restclientwatch.NewDecoder(streaming.NewDecoder(framer.NewFrameReader(io.NopCloser(bytes.NewReader(stream))), streamDec), objDec)
			for range n {
				if _, obj, err := d.Decode(); err != nil || obj.(*v1alpha1.Run).Status.Phase != v1alpha1.PhaseSucceeded {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
	})
	b.Run("Store", func(b *testing.B) {
		newRun := func() *v1alpha1.Run { return new(v1alpha1.Run) }
		b.SetBytes(int64(len(stream)))
		for b.Loop() {
			r := newEventReader[*v1alpha1.Run](io.NopCloser(bytes.NewReader(stream)))
			for range n {
				if _, obj, err := r.read(newRun); err != nil || obj.Status.Phase != v1alpha1.PhaseSucceeded {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
	})
}
