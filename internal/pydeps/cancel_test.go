package pydeps_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// A cancelled install stops pip (proc.Run: its process group) and returns
// the context's error: pip, fetching from a find-links server that never
// answers, holds the connection until it is killed.
func TestCancelledInstallStopsPip(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			conns <- c
		}
	}()
	c := newCache(t, t.TempDir(), "http://"+ln.Addr().String()+"/wheels/")
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := source(t, "tinydep==1.0\n")
	errc := make(chan error, 1)
	go func() {
		_, err := c.Dir(cctx, src)
		errc <- err
	}()
	var conn net.Conn
	select {
	case conn = <-conns:
	case err := <-errc:
		t.Fatalf("the install ended before pip asked the server: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("pip never asked the find-links server")
	}
	defer conn.Close()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Dir: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled install did not return")
	}
	// pip is gone: its end of the connection is closed.
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("pip still holds the connection after the install was cancelled")
				}
			}
			return
		}
	}
}
