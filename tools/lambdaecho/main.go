// Command lambdaecho is a minimal Lambda function built with
// github.com/aws/aws-lambda-go: it returns its event. The Lambda benchmarks
// run it under the same Runtime Interface Emulator as Stoke's bootstrap,
// as the baseline of a Go bootstrap doing nothing else.
package main

import (
	"context"
	"encoding/json"

	"github.com/aws/aws-lambda-go/lambda"
)

func main() {
	lambda.Start(func(_ context.Context, ev json.RawMessage) (json.RawMessage, error) { return ev, nil })
}
