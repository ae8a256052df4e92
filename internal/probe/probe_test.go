package probe

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServeAndCheck(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "probe.sock")
	lis, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	hs := NewHealth("leader")
	done := make(chan error, 1)
	go func() { done <- Serve(t.Context(), lis, hs) }()

	if err := Check(t.Context(), sock, ""); err == nil || !strings.Contains(err.Error(), "NOT_SERVING") {
		t.Fatalf("check before SERVING: %v", err)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	if err := Check(t.Context(), sock, ""); err != nil {
		t.Fatalf("check: %v", err)
	}
	if err := Check(t.Context(), sock, "leader"); err == nil {
		t.Fatal("leader is SERVING")
	}
	if err := Check(t.Context(), sock, "nope"); err == nil {
		t.Fatal("an unknown service is SERVING")
	}
	hs.Shutdown()
	lis.Close()
	if err := <-done; err == nil {
		t.Fatal("Serve returned nil after its listener closed")
	}
}
