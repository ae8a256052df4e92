package lambda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

// Collect deletes the functions Stoke made (name prefix and the
// stoke.dev/run-uid tag) whose Run no longer exists, as exists reports, so
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
