package exec

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "stoke.dev/stoke/api/executor/v1"
)

// countingPool is a buffer pool that counts the buffers given back.
type countingPool struct {
	mu  sync.Mutex
	put int
}

func (p *countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *countingPool) Put(*[]byte) {
	p.mu.Lock()
	p.put++
	p.mu.Unlock()
}

func (p *countingPool) returned() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.put
}

// pieces cuts a marshalled message as grpc-go's transport hands it over:
// in pooled buffers, here cut at each of cuts.
func pieces(t *testing.T, m proto.Message, pool mem.BufferPool, cuts ...int) mem.BufferSlice {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var s mem.BufferSlice
	prev := 0
	for _, c := range append(cuts, len(b)) {
		piece := make([]byte, c-prev, max(c-prev, 2<<10)) // above grpc-go's pooling threshold
		copy(piece, b[prev:c])
		s = append(s, mem.NewBuffer(&piece, pool))
		prev = c
	}
	return s
}

// A data frame is taken as references to the received buffers, whatever
// the cuts (the tag and length cut too); the buffers go back to their pool
// only once the frame is freed.
func TestCodecDataFrameAliasesBuffers(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 2000) // 32000 bytes: a two-byte length
	for _, cuts := range [][]int{nil, {1}, {2}, {3}, {1, 2}, {16384, 31000}, {3, 4}} {
		pool := &countingPool{}
		data := pieces(t, &pb.ExecResponse{Frame: &pb.ExecResponse_Stderr{Stderr: payload}}, pool, cuts...)
		f := inFrame{Message: new(pb.ExecResponse)}
		if err := (codec{}).Unmarshal(data, &f); err != nil {
			t.Fatalf("cuts %v: %v", cuts, err)
		}
		data.Free() // as grpc-go does once Unmarshal returns
		if f.Field != stderrField {
			t.Fatalf("cuts %v: field %d, want stderr (%d)", cuts, f.Field, stderrField)
		}
		if got := bytes.Join(f.pieces, nil); !bytes.Equal(got, payload) {
			t.Fatalf("cuts %v: %d bytes, not the payload", cuts, len(got))
		}
		if pool.returned() != len(cuts)+1-len(f.Data) {
			t.Fatalf("cuts %v: %d buffers back in the pool while the frame holds %d of %d", cuts, pool.returned(), len(f.Data), len(cuts)+1)
		}
		f.free()
		if pool.returned() != len(cuts)+1 {
			t.Fatalf("cuts %v: %d of %d buffers back in the pool after free", cuts, pool.returned(), len(cuts)+1)
		}
	}
}

// Every other frame, a data frame with anything beside it, and a message
// of the other direction go through the proto codec into the message.
func TestCodecOtherFramesUnmarshalled(t *testing.T) {
	withUnknown, err := proto.Marshal(&pb.ExecRequest{Frame: &pb.ExecRequest_Stdin{Stdin: []byte("abc")}})
	if err != nil {
		t.Fatal(err)
	}
	withUnknown = append(withUnknown, 0x78, 0x01) // field 15, varint 1
	cases := []struct {
		name string
		in   mem.BufferSlice
		into proto.Message
		want proto.Message
	}{
		{"exit", pieces(t, &pb.ExecResponse{Frame: &pb.ExecResponse_Exit{Exit: &pb.ExecExit{ExitCode: 3}}}, nil, 1), new(pb.ExecResponse),
			&pb.ExecResponse{Frame: &pb.ExecResponse_Exit{Exit: &pb.ExecExit{ExitCode: 3}}}},
		{"resize", pieces(t, &pb.ExecRequest{Frame: &pb.ExecRequest_Resize{Resize: &pb.TerminalSize{Width: 80, Height: 24}}}, nil), new(pb.ExecRequest),
			&pb.ExecRequest{Frame: &pb.ExecRequest_Resize{Resize: &pb.TerminalSize{Width: 80, Height: 24}}}},
		{"stdin with an unknown field", mem.BufferSlice{mem.SliceBuffer(withUnknown)}, new(pb.ExecRequest), nil},
		// Field 3 of a response is stderr, of a request stdin_close: a
		// request is not taken for a response.
		{"empty stderr read as a request", pieces(t, &pb.ExecResponse{Frame: &pb.ExecResponse_Stderr{Stderr: []byte{}}}, nil), new(pb.ExecRequest),
			&pb.ExecRequest{Frame: &pb.ExecRequest_StdinClose{StdinClose: &pb.ExecStdinClose{}}}},
	}
	for _, c := range cases {
		f := inFrame{Message: c.into}
		if err := (codec{}).Unmarshal(c.in, &f); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if f.Field != 0 || len(f.Data) != 0 {
			t.Fatalf("%s: taken as data frame %d", c.name, f.Field)
		}
		want := c.want
		if want == nil {
			want = c.into.ProtoReflect().Type().New().Interface()
			if err := proto.Unmarshal(c.in.Materialize(), want); err != nil {
				t.Fatal(err)
			}
		}
		if !proto.Equal(f.Message, want) {
			t.Fatalf("%s: got %v, want %v", c.name, f.Message, want)
		}
	}
}

// A frame in pieces reaches the reader in one Read when it fits; put
// returns only once the reader has taken all of it; close is EOF, and a
// closed reader releases put.
func TestFramePipe(t *testing.T) {
	p := newFramePipe()
	put := make(chan error, 1)
	go func() { put <- p.put([][]byte{[]byte("ab"), []byte("cd"), []byte("ef")}) }()
	buf := make([]byte, 4)
	if n, err := p.Read(buf); err != nil || string(buf[:n]) != "abcd" {
		t.Fatalf("first read %q, %v", buf[:n], err)
	}
	select {
	case err := <-put:
		t.Fatalf("put returned (%v) before the frame was taken", err)
	default:
	}
	if n, err := p.Read(buf); err != nil || string(buf[:n]) != "ef" {
		t.Fatalf("second read %q, %v", buf[:n], err)
	}
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	if err := p.put([][]byte{{}, nil}); err != nil { // nothing to hand over
		t.Fatal(err)
	}
	p.close(nil)
	if _, err := p.Read(buf); err != io.EOF {
		t.Fatalf("read after close: %v", err)
	}

	p = newFramePipe()
	go func() { put <- p.put([][]byte{[]byte("abcdef")}) }()
	if _, err := p.Read(buf); err != nil {
		t.Fatal(err)
	}
	p.closeRead()
	if err := <-put; !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("put after closeRead: %v", err)
	}
}

// Data frames are marshalled byte for byte as protobuf marshals them, in
// pooled buffers reused without zeroing (a short frame after a long one
// carries nothing of it); other messages as grpc-go does.
func TestCodecMarshal(t *testing.T) {
	long := bytes.Repeat([]byte{0xaa}, 128<<10)
	for _, m := range []proto.Message{
		&pb.ExecResponse{Frame: &pb.ExecResponse_Stdout{Stdout: long}},
		&pb.ExecResponse{Frame: &pb.ExecResponse_Stderr{Stderr: []byte("short")}},
		&pb.ExecRequest{Frame: &pb.ExecRequest_Stdin{Stdin: long[:70000]}},
		&pb.ExecRequest{Frame: &pb.ExecRequest_Stdin{Stdin: []byte{}}},
		&pb.ExecResponse{Frame: &pb.ExecResponse_Stdout{Stdout: make([]byte, 300<<10)}}, // beyond the pool's buffers
		&pb.ExecRequest{Frame: &pb.ExecRequest_Signal{Signal: 2}},
		&pb.ExecResponse{Frame: &pb.ExecResponse_Exit{Exit: &pb.ExecExit{ExitCode: 1}}},
	} {
		for range 2 {
			got, err := (codec{}).Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			want, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Materialize(), want) {
				t.Fatalf("%T: %d bytes marshalled, want protobuf's %d", m, got.Len(), len(want))
			}
			got.Free()
		}
	}
}
