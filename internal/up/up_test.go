package up_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/testbin"
	"stoke.dev/stoke/internal/up"
)

var stokeBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = bin
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { cleanup() }))
}

// server is a `stoke up` running in this process, with real pods.
type server struct {
	url, token, dataDir string
	client              *http.Client
}

type option func(*up.Config)

func oneOfEach(cfg *up.Config) {
	mk := func(name string) *v1alpha1.Runtime {
		return &v1alpha1.Runtime{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: store.DefaultNamespace},
			Spec:       v1alpha1.RuntimeSpec{Server: name, Replicas: 1, Runs: 8},
		}
	}
	cfg.DefaultRuntimes = []*v1alpha1.Runtime{mk("bash"), mk("python")}
}

func startUp(t testing.TB, opts ...option) *server {
	t.Helper()
	dataDir := t.TempDir()
	if err := os.Chmod(dataDir, 0o700); err != nil { // stoke up wants it private
		t.Fatal(err)
	}
	urlc := make(chan string, 1)
	cfg := up.Config{
		DataDir: dataDir, Listen: "127.0.0.1:0",
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		PodCommand: func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(stokeBin, args...) },
		Ready:      func(url string) { urlc <- url },
	}
	oneOfEach(&cfg)
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Run(ctx, cfg) }()
	var url string
	select {
	case url = <-urlc:
	case err := <-done:
		cancel()
		t.Fatalf("stoke up ended at start: %v", err)
	}
	tok, err := os.ReadFile(filepath.Join(dataDir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	s := &server{url: url, token: strings.TrimSpace(string(tok)), dataDir: dataDir,
		client: &http.Client{Transport: &http.Transport{}}}
	t.Cleanup(func() {
		s.client.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("stoke up: %v", err)
		}
	})
	return s
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) String() string { return fmt.Sprintf("%d %s", r.status, r.body) }

// do sends a request with the server's token unless hdr sets
// Authorization ("" sends none).
func (s *server) do(t testing.TB, method, path, body string, hdr map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

func (s *server) create(t testing.TB, manifest string) *v1alpha1.Run {
	t.Helper()
	r := s.do(t, http.MethodPost, "/v1/namespaces/default/runs", manifest, map[string]string{"Content-Type": "application/yaml"})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	var run v1alpha1.Run
	if err := json.Unmarshal(r.body, &run); err != nil {
		t.Fatal(err)
	}
	return &run
}

func (s *server) runs(t testing.TB) []v1alpha1.Run {
	t.Helper()
	r := s.do(t, http.MethodGet, "/v1/namespaces/default/runs", "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("list: %s", r)
	}
	var list v1alpha1.RunList
	if err := json.Unmarshal(r.body, &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// watchUntil follows the Runs watch until done says so for an event, and
// returns that event's Run.
func (s *server) watchUntil(t testing.TB, done func(typ string, run *v1alpha1.Run) bool) *v1alpha1.Run {
	t.Helper()
	return s.watchFrom(t, "", done)
}

// watchFrom is watchUntil from a resource version ("" lists first).
func (s *server) watchFrom(t testing.TB, rv string, done func(typ string, run *v1alpha1.Run) bool) *v1alpha1.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/namespaces/default/runs?watch=true&resourceVersion="+rv, nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "application/x-ndjson" {
		t.Fatalf("watch: %d %s", resp.StatusCode, ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		var ev struct {
			Type   string       `json:"type"`
			Object v1alpha1.Run `json:"object"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("watch line %q: %v", sc.Bytes(), err)
		}
		if done(ev.Type, &ev.Object) {
			return &ev.Object
		}
	}
	t.Fatalf("watch ended before the awaited event: %v", sc.Err())
	return nil
}

func (s *server) waitPhase(t testing.TB, name string, phases ...v1alpha1.Phase) *v1alpha1.Run {
	t.Helper()
	return s.watchUntil(t, func(_ string, run *v1alpha1.Run) bool {
		if run.Name != name {
			return false
		}
		for _, p := range phases {
			if run.Status.Phase == p {
				return true
			}
		}
		return false
	})
}

// logRecords reads a Run's log records.
func (s *server) logRecords(t testing.TB, name string, follow bool) []map[string]any {
	t.Helper()
	path := "/v1/namespaces/default/runs/" + name + "/logs"
	if follow {
		path += "?follow=true"
	}
	r := s.do(t, http.MethodGet, path, "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("logs: %s", r)
	}
	var out []map[string]any
	for line := range strings.Lines(string(r.body)) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// followUntil follows name's log (an event stream) until a record
// satisfies match and returns it, or fails after a minute.
func (s *server) followUntil(t testing.TB, name string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/namespaces/default/runs/"+name+"/logs?follow=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("follow logs of %s: %s", name, resp.Status)
	}
	var seen []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if match(rec) {
			return rec
		}
		seen = append(seen, rec)
	}
	t.Fatalf("log of %s ended (%v) without the record; saw %v", name, sc.Err(), seen)
	return nil
}
