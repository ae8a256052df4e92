// Package invokefloor is the structural floor of Stoke's function invoke
// path, with no Stoke code on it, for the invoke benchmark
// (BenchmarkUpInvokePeers) to measure beside Stoke: a net/http server (the
// front process, keep-alive HTTP/1.1) whose handler makes one grpc-go
// unary executor.v1 FunctionRuntime/InvokeFunction call over a Unix socket
// in a 0700 directory to a gRPC server in a second process (the back, with
// the Runtime Server's transport options and GOMAXPROCS), whose handler
// writes the input to a persistent python3 worker over a pipe and returns
// its answer. That is the shape the gRPC contract gives Stoke's path
// (client → gateway and runtimed → Runtime Server → worker) with only the
// hops in it. Command invokefloor (cmd/invokefloor) runs either process;
// the front starts the back.
package invokefloor
