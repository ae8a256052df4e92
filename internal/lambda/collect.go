package lambda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

// Collect deletes the functions Stoke made (name prefix and the
// stoke.dev/run-uid tag) whose Run no longer needs them (gone or finished),
// as exists reports, so
// that a crash leaves nothing behind in the account. A Runtime Server
// deletes its functions itself; this is for the ones whose server died
// first. It returns the names it deleted.
func Collect(ctx context.Context, c *awslambda.Client, prefix string, exists func(ctx context.Context, runUID string) (bool, error), log *slog.Logger) ([]string, error) {
	if prefix == "" {
		prefix = DefaultNamePrefix
	}
	var deleted []string
	var errs []error
	pages := awslambda.NewListFunctionsPaginator(c, &awslambda.ListFunctionsInput{})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return deleted, awsError("ListFunctions", err)
		}
		for _, fn := range page.Functions {
			name := aws.ToString(fn.FunctionName)
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			tags, err := c.ListTags(ctx, &awslambda.ListTagsInput{Resource: fn.FunctionArn})
			var nf *types.ResourceNotFoundException
			if errors.As(err, &nf) {
				continue // deleted meanwhile
			}
			if err != nil {
				errs = append(errs, awsError("ListTags", err))
				continue
			}
			uid, ok := tags.Tags[TagRunUID]
			if !ok {
				continue // not Stoke's
			}
			alive, err := exists(ctx, uid)
			if err != nil {
				errs = append(errs, fmt.Errorf("run %s: %w", uid, err))
				continue
			}
			if alive {
				continue
			}
			_, err = c.DeleteFunction(ctx, &awslambda.DeleteFunctionInput{FunctionName: aws.String(name)})
			if err != nil && !errors.As(err, &nf) {
				errs = append(errs, awsError("DeleteFunction", err))
				continue
			}
			log.Info("collected an orphaned lambda function", "function", name, "run_uid", uid)
			deleted = append(deleted, name)
		}
	}
	return deleted, errors.Join(errs...)
}

// DefaultCollectInterval is how often a Collector runs.
const DefaultCollectInterval = time.Minute

// Collector runs Collect for every name prefix in use, now and then every
// Interval, until its context ends. It makes its client (the default AWS
// configuration) when a prefix first needs one.
type Collector struct {
	Interval time.Duration
	// Prefixes are the name prefixes of the lambda Runtimes that exist.
	Prefixes func() []string
	// Exists reports whether the Run with this UID still needs its
	// function (it exists and has not finished). It must answer from
	// state that includes every Run whose function may be being created.
	Exists func(ctx context.Context, runUID string) (bool, error)
	// Client overrides NewClient (tests).
	Client func(ctx context.Context) (*awslambda.Client, error)
	Logger *slog.Logger
}

// Run collects until ctx ends.
func (c *Collector) Run(ctx context.Context) error {
	if c.Interval <= 0 {
		c.Interval = DefaultCollectInterval
	}
	if c.Client == nil {
		c.Client = NewClient
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	var client *awslambda.Client
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		if prefixes := c.Prefixes(); len(prefixes) > 0 {
			if client == nil {
				var err error
				if client, err = c.Client(ctx); err != nil {
					c.Logger.Warn("lambda collector: no AWS client", "error", err)
				}
			}
			for _, p := range prefixes {
				if client == nil {
					break
				}
				if _, err := Collect(ctx, client, p, c.Exists, c.Logger); err != nil && ctx.Err() == nil {
					c.Logger.Warn("lambda collector", "prefix", p, "error", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
