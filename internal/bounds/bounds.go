// Package bounds is Stoke's one table of size and count limits. Every entry
// point enforces these constants; none restates them.
package bounds

import (
	"strconv"
	"time"
)

const (
	// InvokeBody is the largest invocation input (and function output).
	InvokeBody = 1 << 20
	// InvocationID is the longest caller-supplied invocation ID, in bytes.
	InvocationID = 128
	// RunUID is the longest Run UID a Runtime Server accepts, in bytes.
	RunUID = 128

	// OutputKeys is the most outputs one task or invocation may set.
	OutputKeys = 64
	// OutputKey is the longest output key, in bytes.
	OutputKey = 128
	// OutputValue is the longest output value, in bytes.
	OutputValue = 8 << 10
	// OutputsTotal bounds all keys and values of one outputs map together.
	OutputsTotal = 64 << 10

	// DirPool is how many emptied working or scratch directories one
	// runtime.DirPool keeps for reuse.
	DirPool = 64

	// ApplyCreates is how many Run creates `stoke apply` keeps in flight
	// at once (and how many idle connections a client keeps to its server).
	ApplyCreates = 16

	// KubeListPage is the most objects the Kubernetes store asks the API
	// server for in one List request (limit); a longer List follows the
	// continue tokens, so that no response holds a whole namespace.
	KubeListPage = 500

	// MetricsScrape bounds the metric families one process hands out on
	// the metrics.v1 gRPC service (a Runtime Server's are a few KiB).
	MetricsScrape = 1 << 20
	// DebugProfile bounds one profile `stoke debug pprof` copies from a
	// debug socket (a busy process's CPU profile is a few hundred KiB).
	DebugProfile = 64 << 20

	// Message bounds fatal_error, status.message and function error
	// messages, and so every error message the HTTP API answers and every
	// attribute of a log line (see Echo): each may repeat what a client
	// sent, which must not make an answer or a log line as large as the
	// request.
	Message = 4 << 10
	// Quoted is how much of one value a client sent (a label value, a
	// path, a query parameter) an error message repeats (see Quote).
	Quoted = 64
	// StackTrace bounds the stack trace carried with a function error.
	StackTrace = 8 << 10

	// DockerRequest bounds a Docker API request body read whole (a
	// container or exec create); DockerExecs the exec sessions the Docker
	// API remembers (created, running, or ended and still inspectable);
	// DockerArchive the bytes one `docker cp` moves either way;
	// DockerEvents the container events kept for `docker events --since`
	// (a follower that falls that far behind is disconnected);
	// DockerCreated the containers of a namespace created and not started
	// (held Runs, counted in the Runs in memory: the gateway's replicas
	// may each let one more through at the same instant).
	DockerRequest = 1 << 20
	DockerExecs   = 1024
	DockerArchive = 1 << 30
	DockerEvents  = 1024
	DockerCreated = 1024
	// DockerNamespaces bounds the namespaces the Kubernetes gateway's
	// Docker API keeps state (and a Run watch) for; DockerWatchEvents the
	// Run events one of those watches holds for its follower before it is
	// ended (the follower then watches again).
	DockerNamespaces  = 256
	DockerWatchEvents = 1024

	// Handler is the longest handler string.
	Handler = 512
	// EnvEntries is the most environment variables a Run or registration sets.
	EnvEntries = 256
	// Args is the most task arguments; Arg the longest one.
	Args = 256
	Arg  = 8 << 10

	// CapturedStream is how much stdout and stderr an execution keeps each;
	// the rest only goes to logs.
	CapturedStream = 1 << 20
	// LogLine is the longest log line; longer writes are split.
	LogLine = 16 << 10

	// Source bounds a Run's inline source text and its source archive.
	Source = 1 << 20
	// Path is the longest path a Run names (entrypoint, source path, a
	// source archive's member, a Lambda bootstrap): Linux's PATH_MAX.
	Path = 4 << 10
	// GitURL is the longest spec.source.git.url; GitRef the longest ref.
	GitURL = 2 << 10
	GitRef = 1 << 10
	// GitTree bounds the files of one commit's tree in the git cache.
	GitTree = 1 << 30
	// PlacementName is the longest spec.placement.podUID and workspace.
	PlacementName = 128
	// APIStreams bounds the watch and followed-log responses the HTTP API
	// keeps open at once; each holds a store watcher or a log reader.
	APIStreams = 512
	// BearerToken is the longest bearer token the gateway takes; a
	// longer one is refused before any authority is asked about it (a
	// Kubernetes ServiceAccount token is about 1 KiB, an OIDC token a few).
	BearerToken = 16 << 10
	// AuthCache is how many callers (token hashes) the Kubernetes
	// gateway keeps authentication decisions for, and how many
	// authorization decisions; the least recently used go first.
	AuthCache = 4096
	// ObjectBody bounds a Run or Runtime sent to the HTTP API: a Source in
	// base64 plus every argument at its bound fits.
	ObjectBody = 4 << 20
	// ObjectBodiesAtOnce bounds the bytes of object bodies the HTTP API
	// reads and decodes at once (a YAML body's decoding takes several
	// times its size); further bodies wait, unread.
	ObjectBodiesAtOnce = 2 * ObjectBody
	// ObjectJSON bounds an object's JSON without its status, as the store
	// encodes it: an ObjectBody request plus the defaults and system
	// metadata Stoke adds. Fields each within their own bound may still
	// sum, or escape ('<' is six bytes of JSON), past it.
	ObjectJSON = ObjectBody + 64<<10
	// StoredObject bounds one object in the store: an ObjectJSON object
	// plus a status with every field at its bound (outputs, env, message,
	// conditions), each byte escaped at worst as \u00XX.
	StoredObject = ObjectJSON + 1<<20
	// RetryAttempts is the largest spec.retryPolicy.maxAttempts.
	RetryAttempts = 100
	// RuntimeReplicas is the most pods one Runtime pool may have; bigger
	// pools are several Runtimes.
	RuntimeReplicas = 64
	// LambdaZip bounds a Lambda deployment package as uploaded (Lambda's
	// own limit for a zip sent with CreateFunction); LambdaUnzipped bounds
	// it unpacked, and LambdaEnv the function's environment variables,
	// keys and values together. A package past them is refused before any
	// AWS call.
	LambdaZip      = 50 << 20
	LambdaUnzipped = 250 << 20
	LambdaEnv      = 4 << 10
	// LambdaPayload bounds a synchronous Lambda invocation's event and
	// answer, as Lambda does.
	LambdaPayload = 6 << 20
	// RuntimeRuns is the most Run slots per runtime pod: each slot is a
	// working directory and, for a function, a warm process.
	RuntimeRuns = 1024

	// ExecFrame is the most stdin, stdout or stderr bytes one exec frame
	// carries, gRPC or WebSocket, and so each exec pump's one buffer and
	// each end's WebSocket read and write buffer: each frame costs system
	// calls and wake-ups at every hop, so it is large (the exec codec
	// marshals it without grpc-go's zeroed pool, and receives it without
	// copying it together).
	ExecFrame = 128 << 10
	// Requirements bounds a Run's requirements.txt (internal/pydeps).
	Requirements = 64 << 10
	// ExecControlFrame bounds a WebSocket exec message that is not stdin:
	// a resize or a close.
	ExecControlFrame = 1 << 10
	// ExecSessionsPerRun and ExecSessionsPerServer bound the concurrent
	// exec sessions into one Run and on one Runtime Server; the next one
	// is refused at once (ResourceExhausted, HTTP 429).
	ExecSessionsPerRun    = 8
	ExecSessionsPerServer = 64
	// AttachReplay is the most output of a task with stdin or a terminal
	// that is held, per stream, until the first attach session joins it
	// (`docker run -it` attaches once the task runs): past it the oldest
	// bytes go (the Run's log has them all).
	AttachReplay = 256 << 10

	// FunctionReplicas is the most replicas (spec.replicas, scale.min,
	// scale.max) one Function may have; FunctionTargetInFlight the largest
	// scale.targetInFlight.
	FunctionReplicas       = 1024
	FunctionTargetInFlight = 1024
	// FunctionIdleSeconds is the longest scale.idleSeconds (a day).
	FunctionIdleSeconds = 86400
	// FunctionDrainSeconds is the longest spec.drainSeconds.
	FunctionDrainSeconds = 300
	// ScaleReason bounds status.lastScale.reason.
	ScaleReason = 1 << 10

	// A WorkflowRun (issue 22): WorkflowJobs bounds the jobs of one spec,
	// WorkflowMatrix the combinations of one job's matrix (and its axes'
	// values, include and exclude entries), WorkflowJobInstances the job
	// instances of one WorkflowRun after matrix expansion (called
	// Workflows' jobs included), WorkflowSteps the steps of one job, and
	// WorkflowStepInstances the step statuses of one WorkflowRun (job
	// instances × their steps). With the status fields' own bounds they
	// keep a WorkflowRun's status under 1 MiB (docs/workflows.md).
	WorkflowJobs          = 64
	WorkflowMatrix        = 256
	WorkflowMatrixAxes    = 16
	WorkflowJobInstances  = 256
	WorkflowSteps         = 100
	WorkflowStepInstances = 512
	// WorkflowMatrixValues bounds one combination's values as JobStatus
	// keeps them (keys and JSON values together).
	WorkflowMatrixValues = 256
	// WorkflowExpression bounds one expression: an if:, or a value with
	// ${{ }} in it, as written.
	WorkflowExpression = 4 << 10
	// WorkflowValue bounds what one template evaluates to (a format() or
	// join() can make more than it was given).
	WorkflowValue = 64 << 10
	// WorkflowCallDepth bounds nested Workflow calls: a WorkflowRun's job
	// calling a Workflow is depth 1.
	WorkflowCallDepth = 4
	// WorkflowCalled bounds the distinct Workflows one WorkflowRun calls
	// (spec.workflow's included), and so status.snapshot's entries.
	WorkflowCalled = 8
	// WorkflowSpec bounds a WorkflowRun's or Workflow's spec as JSON;
	// WorkflowSnapshot all the specs one status.snapshot copies.
	WorkflowSpec     = 64 << 10
	WorkflowSnapshot = 128 << 10
	// WorkflowOutputs bounds all job outputs of one WorkflowRun together
	// (each job's are within OutputKeys, OutputKey and OutputValue), and
	// the run's own outputs.
	WorkflowOutputs = 64 << 10
	// WorkflowJobMessage and WorkflowStepMessage bound a job instance's
	// and a step's status message.
	WorkflowJobMessage  = 1 << 10
	WorkflowStepMessage = 256
	// WorkflowName bounds a job's or step's display name; WorkflowID a
	// job's or step's id (a DNS label's length).
	WorkflowName = 128
	WorkflowID   = 63
	// WorkflowInputs bounds a Workflow's inputs and a call's with:.
	WorkflowInputs = 64
	// WorkflowRunScript bounds a step's run: (also within WorkflowSpec).
	WorkflowRunScript = 64 << 10
	// hashFiles() (internal/hashfiles): HashFilesCalls bounds the
	// distinct calls one step makes (each is one output of its hash Run),
	// HashFilesPatterns the patterns of one call, HashFilesPattern one
	// pattern's bytes, and HashFilesFiles the files one call hashes;
	// HashFilesTimeout is the hash Run's limit (GitHub's own: 120 s).
	HashFilesCalls    = 16
	HashFilesPatterns = 64
	HashFilesPattern  = 1 << 10
	HashFilesFiles    = 100_000
	HashFilesTimeout  = 120 * time.Second
	// StepSummary bounds what a Run keeps of its $GITHUB_STEP_SUMMARY
	// (GitHub keeps 1 MiB; a Run's status is an etcd object).
	StepSummary = 8 << 10
	// StepSummaryStored is what a Run's status.summary may hold: the kept
	// summary and the note that says it was cut.
	StepSummaryStored = StepSummary + 256

	// Workflow artifacts (internal/artifact, docs/workflows.md):
	// ArtifactBytes bounds one artifact's tar (its files' contents),
	// ArtifactFiles its entries, Artifacts the artifacts of one
	// WorkflowRun and ArtifactRunBytes their bytes together; ArtifactName
	// bounds a name ([A-Za-z0-9._-], GitHub's characters less the ones a
	// path or URL would need quoted) and ArtifactPaths the lines of an
	// upload's path:.
	ArtifactBytes    = 1 << 30
	ArtifactFiles    = 10000
	Artifacts        = 256
	ArtifactRunBytes = 4 << 30
	ArtifactName     = 128
	ArtifactPaths    = 64
	// A Lambda step's write-back (docs/lambda.md): WriteBackDeletions
	// and WriteBackDeletionBytes bound the paths one step removed, which
	// travel in one agent message (at most ExecFrame + 64 KiB), and
	// WriteBackEntries the new or changed entries one write-back copies.
	WriteBackDeletions     = 4096
	WriteBackDeletionBytes = 128 << 10
	WriteBackEntries       = 65536
	// ArtifactRetention is how long an artifact is kept at most (its
	// WorkflowRun's delete takes it sooner); ArtifactRetentionDefault
	// when `stoke up`/`stoke controller` are told nothing.
	ArtifactRetention        = 90 * 24 * time.Hour
	ArtifactRetentionDefault = 7 * 24 * time.Hour
)

// A Function's defaults for what its spec leaves out, or sets to 0 (the
// CRD's default markers restate them; internal/validation's
// SetFunctionDefaults applies them before either store writes). The
// queue's are below (FunctionQueue, FunctionQueueWait).
const (
	// DefaultFunctionMax is scale.max's default; scale.min's is 0 (an idle
	// Function has no replicas), which Go's zero value says.
	DefaultFunctionMax            = 8
	DefaultFunctionTargetInFlight = 1
	DefaultFunctionIdleSeconds    = 60
	DefaultFunctionDrainSeconds   = 2
)

// A Function's invocation queue in the gateway (internal/dispatch): how
// many invocations may wait for an idle replica, and how long each may
// wait. The defaults apply when a Function leaves them unset; the
// maxima bound what one may set.
const (
	FunctionQueue     = 256
	MaxFunctionQueue  = 10000
	FunctionQueueWait = 10 * time.Second
	// MaxFunctionQueueWait is MaxInvokeTimeout: a wait counts against
	// the invocation's own timeout, so a longer one would never be used.
	MaxFunctionQueueWait = MaxInvokeTimeout
)

// Server-side defaults for limits a request may leave at zero. Zero never
// means unlimited.
const (
	DefaultInvokeTimeout = 30 * time.Second
	MaxInvokeTimeout     = 15 * time.Minute
	MaxTaskDuration      = 6 * time.Hour
	InitTimeout          = 60 * time.Second
	// MaxBackoff caps the retry engine's doubling backoff.
	MaxBackoff = 60 * time.Second
)

// Truncate shortens s to at most max bytes without splitting a UTF-8
// sequence, marking the cut, so bounded text stays valid UTF-8.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const mark = "…[truncated]"
	if max < len(mark) {
		return s[:runeStart(s, max)]
	}
	return s[:runeStart(s, max-len(mark))] + mark
}

// TruncateHead keeps the last max bytes of s (where a traceback's or a log's
// useful part is), marking the cut.
func TruncateHead(s string, max int) string {
	if len(s) <= max {
		return s
	}
	const mark = "[truncated]…"
	if max < len(mark) {
		return s[runeEnd(s, len(s)-max):]
	}
	return mark + s[runeEnd(s, len(s)-(max-len(mark))):]
}

// runeStart moves i back to the start of the rune it falls in.
func runeStart(s string, i int) int {
	for i > 0 && i < len(s) && s[i]&0xC0 == 0x80 {
		i--
	}
	return max(i, 0)
}

// runeEnd moves i forward past a rune it falls inside.
func runeEnd(s string, i int) int {
	for i > 0 && i < len(s) && s[i]&0xC0 == 0x80 {
		i++
	}
	return i
}

// Quote is how an error message repeats one value a client sent: at most
// Quoted bytes of it, in Go's quotes.
func Quote(s string) string {
	return strconv.Quote(Truncate(s, Quoted))
}

// Echo cuts text that may carry a client's input — an error message an
// answer carries, an attribute of a log line — to Message bytes. The
// gateway's one error writer and the process's one log handler call it.
func Echo(s string) string {
	return Truncate(s, Message)
}
