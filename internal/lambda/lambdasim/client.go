package lambdasim

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
)

// Client is the real SDK client pointed at the simulator with its one
// access key, as Stoke's Lambda Runtime Server is configured against it.
func (s *Simulator) Client() *lambda.Client {
	return lambda.New(lambda.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.URL()),
		Credentials:  credentials.NewStaticCredentialsProvider(s.cfg.AccessKeyID, "secret", ""),
	})
}
