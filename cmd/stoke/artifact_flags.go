package main

import (
	"github.com/spf13/pflag"

	"stoke.dev/stoke/internal/artifact"
)

// addArtifactS3Flags adds the S3 artifact store's flags, the same on
// `stoke controller` (which writes the store), `stoke gateway` (which
// serves `stoke artifacts` from it) and `stoke up` (both; without a
// bucket it keeps artifacts in its data directory: withoutBucket says
// what happens without one). The credentials come from the AWS
// chain: the chart sets AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from a
// Secret, never in arguments.
func addArtifactS3Flags(f *pflag.FlagSet, cfg *artifact.S3Config, withoutBucket string) {
	f.StringVar(&cfg.Bucket, "artifact-s3-bucket", "", "the S3 bucket of workflow artifacts (it must exist; empty: "+withoutBucket+")")
	f.StringVar(&cfg.Prefix, "artifact-s3-prefix", "", `the prefix of every artifact key (default "stoke-artifacts/")`)
	f.StringVar(&cfg.Endpoint, "artifact-s3-endpoint", "", "an S3-compatible server's URL (default: AWS's for the region)")
	f.StringVar(&cfg.Region, "artifact-s3-region", "", "the bucket's region (default: the AWS configuration's, $AWS_REGION)")
	f.BoolVar(&cfg.PathStyle, "artifact-s3-path-style", false, "address the bucket in the URL's path, as most S3-compatible servers that are not AWS want")
}
