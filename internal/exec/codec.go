package exec

import (
	"encoding/binary"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
)

// The Exec stream's codec writes and reads the protobuf wire format, as
// grpc-go's own codec does (it hands it every other message), but a data
// frame received into an *inFrame keeps grpc's receive buffers instead of
// being copied out of them twice (into one contiguous buffer, then into a
// new slice that the garbage collector reclaims), and a data frame sent is
// marshalled into a pooled buffer that is not zeroed first (grpc-go's
// pool zeroes every buffer it hands out, 1 MiB for any message over
// 32 KiB); every byte of it is written over.

// ServerCodec is the server option that serves the Exec stream's data
// frames without copying them. A server without it still serves the Exec
// service, through grpc-go's proto codec. It names itself "proto" and
// handles any protobuf message, so it can be a whole server's codec.
func ServerCodec() grpc.ServerOption { return grpc.ForceServerCodecV2(codec{}) }

// callCodec is the client side's: the same codec for one Exec stream.
func callCodec() grpc.CallOption { return grpc.ForceCodecV2(codec{}) }

type codec struct{}

// protoCodec is grpc-go's proto codec (registered by its package's init).
var protoCodec = encoding.GetCodecV2(grpcproto.Name)

func (codec) Name() string { return grpcproto.Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if num, data, ok := dataFrame(v); ok {
		size := protowire.SizeTag(num) + protowire.SizeBytes(len(data))
		buf := framePool.Get(size)
		b := protowire.AppendTag((*buf)[:0], num, protowire.BytesType)
		*buf = protowire.AppendBytes(b, data)
		return mem.BufferSlice{mem.NewBuffer(buf, framePool)}, nil
	}
	return protoCodec.Marshal(v)
}

// dataFrame returns the field and bytes of a message that is a data frame
// and nothing else.
func dataFrame(v any) (protowire.Number, []byte, bool) {
	var num protowire.Number
	var data []byte
	var m proto.Message
	switch m1 := v.(type) {
	case *pb.ExecRequest:
		f, ok := m1.GetFrame().(*pb.ExecRequest_Stdin)
		if !ok {
			return 0, nil, false
		}
		num, data, m = stdinField, f.Stdin, m1
	case *pb.ExecResponse:
		switch f := m1.GetFrame().(type) {
		case *pb.ExecResponse_Stdout:
			num, data = stdoutField, f.Stdout
		case *pb.ExecResponse_Stderr:
			num, data = stderrField, f.Stderr
		default:
			return 0, nil, false
		}
		m = m1
	default:
		return 0, nil, false
	}
	if len(m.ProtoReflect().GetUnknown()) != 0 {
		return 0, nil, false
	}
	return num, data, true
}

// framePool holds the buffers data frames are marshalled into; a frame
// fills its buffer, so none is zeroed.
var framePool mem.BufferPool = &dirtyPool{size: bounds.ExecFrame + 2*binary.MaxVarintLen64}

// dirtyPool pools buffers of one size without zeroing them; a larger
// buffer is allocated and left to the garbage collector.
type dirtyPool struct {
	size int
	pool sync.Pool
}

func (p *dirtyPool) Get(n int) *[]byte {
	if n > p.size {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.pool.Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, p.size)
	return &b
}

func (p *dirtyPool) Put(b *[]byte) {
	if cap(*b) == p.size {
		p.pool.Put(b)
	}
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*inFrame); ok {
		return f.unmarshal(data)
	}
	return protoCodec.Unmarshal(data, v)
}

// Field numbers of the data frames.
var (
	stdinField  = fieldNumber(&pb.ExecRequest{}, "stdin")
	stdoutField = fieldNumber(&pb.ExecResponse{}, "stdout")
	stderrField = fieldNumber(&pb.ExecResponse{}, "stderr")
)

func fieldNumber(m proto.Message, name string) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name))
	if f == nil {
		panic(fmt.Sprintf("exec: %T has no field %s", m, name))
	}
	return f.Number()
}

// inFrame is one received Exec frame. Message (a *pb.ExecRequest or a
// *pb.ExecResponse) is embedded so that any proto codec can fill it. The
// exec codec fills it only for frames other than data; a data frame's
// payload stays in the received buffers: Field names it and Data holds
// references to the buffers, which the receiver frees once it has passed
// the bytes on. A receiver that keeps them (it gives up waiting for its
// reader) lets the garbage collector have them instead: a buffer that is
// never freed is never reused.
type inFrame struct {
	proto.Message
	// Field is the data frame's field, 0 when Message holds the frame.
	Field protowire.Number
	Data  mem.BufferSlice
	// pieces is Data's bytes, reused from frame to frame.
	pieces [][]byte
}

// dataFields are the fields of m's data frames.
func dataFields(m proto.Message) (a, b protowire.Number) {
	switch m.(type) {
	case *pb.ExecRequest:
		return stdinField, stdinField
	case *pb.ExecResponse:
		return stdoutField, stderrField
	}
	return 0, 0
}

// unmarshal takes a data frame — a message that is exactly one bytes
// field of a data frame — as references to data's buffers, and anything
// else through the proto codec. The protobuf semantics are the same: such
// a message means exactly that one field set.
func (f *inFrame) unmarshal(data mem.BufferSlice) error {
	f.Field, f.Data, f.pieces = 0, f.Data[:0], f.pieces[:0]
	var head [2 * binary.MaxVarintLen64]byte
	n := copyPrefix(head[:], data)
	num, typ, tagLen := protowire.ConsumeTag(head[:n])
	a, b := dataFields(f.Message)
	if tagLen < 0 || typ != protowire.BytesType || num == 0 || (num != a && num != b) {
		return protoCodec.Unmarshal(data, f.Message)
	}
	size, sizeLen := protowire.ConsumeVarint(head[tagLen:n])
	skip := tagLen + sizeLen
	if sizeLen < 0 || uint64(data.Len()-skip) != size {
		return protoCodec.Unmarshal(data, f.Message)
	}
	for _, buf := range data {
		l := buf.Len()
		if skip >= l {
			skip -= l
			continue
		}
		piece := buf.Slice(skip, l) // a reference of its own
		skip = 0
		f.Data = append(f.Data, piece)
		f.pieces = append(f.pieces, piece.ReadOnlyData())
	}
	f.Field = num
	return nil
}

// copyPrefix copies the first len(dst) bytes of data, or all of it.
func copyPrefix(dst []byte, data mem.BufferSlice) int {
	n := 0
	for _, buf := range data {
		if n == len(dst) {
			break
		}
		n += copy(dst[n:], buf.ReadOnlyData())
	}
	return n
}

// free drops the frame's references to the received buffers.
func (f *inFrame) free() {
	f.Data.Free()
	f.Data = f.Data[:0]
	clear(f.pieces)
	f.pieces = f.pieces[:0]
}
