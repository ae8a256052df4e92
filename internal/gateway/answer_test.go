package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/gateway"
)

// bigAnswer stands where the function's proxy hop stands and answers
// every call with output.
type bigAnswer struct {
	pb.UnimplementedFunctionRuntimeServer
	output []byte
}

func (b *bigAnswer) Route(_, _, _ string) (pb.FunctionRuntimeServer, error) { return b, nil }

func (b *bigAnswer) InvokeFunction(_ context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	return &pb.InvokeFunctionResponse{InvocationId: req.GetInvocationId(), Output: b.output, ContentType: "application/json"}, nil
}

// An invocation's answer carries its length and is sent whole, however
// large: the gateway writes it before its own handler's end, not chunked
// as net/http sends a body of unknown length over its buffer.
func TestInvokeAnswerHasItsLength(t *testing.T) {
	for _, n := range []int{1, 5000, 100000} {
		out := []byte(strconv.Quote(strings.Repeat("x", n)))
		url := serve(t, gateway.Config{API: plane, Router: &bigAnswer{output: out}})
		req, err := http.NewRequest(http.MethodPost, url+"/v1/namespaces/default/runs/f/uid/invoke", strings.NewReader(`1`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != string(out) {
			t.Fatalf("%d bytes: %d, %d bytes back (%v)", len(out), resp.StatusCode, len(body), err)
		}
		if resp.ContentLength != int64(len(out)) || len(resp.TransferEncoding) != 0 {
			t.Errorf("%d bytes: Content-Length %d, Transfer-Encoding %v", len(out), resp.ContentLength, resp.TransferEncoding)
		}
	}
}
