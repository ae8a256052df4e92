# Stoke's developer entry points. CI runs .ci/run, which uses these targets.
GO       ?= go
TOOL     := $(GO) tool -modfile=tools/go.mod
PKGS     := ./...
BENCHTIME ?= 2s

.PHONY: all build generate check-generated test bench lint fuzz clean

all: build

# stoke, and beside it the small bootstrap a lambda Runtime Server packages
# into its functions (docs/lambda.md), stripped to keep the package small.
build:
	$(GO) build -o bin/stoke ./cmd/stoke
	$(GO) build -trimpath -ldflags='-s -w' -o bin/stoke-lambda-bootstrap ./cmd/stoke-lambda-bootstrap

# Regenerates the protobuf code, the API types' deepcopy code and the CRDs
# (deploy/crds) with the generator versions pinned in tools/go.mod, then
# the plain manifests rendered from the Helm chart (deploy/controller,
# deploy/examples/runtimes.yaml) and the chart's copy of the CRDs. The
# output is committed; check-generated fails when stale.
GENERATED := api/ deploy/crds/ deploy/controller/ deploy/examples/ deploy/helm/stoke/crds/
generate:
	$(TOOL) buf generate
	$(TOOL) controller-gen object crd paths=./api/stoke/... output:crd:dir=deploy/crds
	STOKE_WRITE_GENERATED=1 $(GO) test -count=1 -run '^TestGeneratedManifestsAreTheChart$$' ./deploy/

check-generated: generate
	@git diff --exit-code -- $(GENERATED) || { echo "generated code is stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- $(GENERATED))" || { git status --porcelain -- $(GENERATED); echo "untracked generated files: run 'make generate' and commit"; exit 1; }

# The test command the README gives, after building the test dependencies
# (docs/testing.md) so that no test waits for a cold build.
test:
	$(GO) run ./internal/testdeps/cmd/testdeps >/dev/null
	$(GO) test -race -count=1 $(PKGS)

# The figures the issues ask for; run on a quiet machine. Each line is one
# figure family, with a benchtime that suits it.
BENCH := $(GO) test -run '^$$' -bench
bench:
	$(BENCH) 'Invoke|ForkPerCall' -benchtime 2000x ./internal/runtime/server/
	$(BENCH) 'Register' -benchtime 100x ./internal/runtime/server/
	$(BENCH) 'DirInstalled' -benchtime 2000x ./internal/pydeps/
	$(BENCH) 'IdleRegistrations' -benchtime 1x ./internal/runtime/server/
	$(BENCH) 'CreateToSucceeded' -benchtime 1000x ./internal/standalone/
	$(BENCH) 'Throughput' -benchtime 3x ./internal/standalone/
	$(BENCH) 'CreateToReady' -benchtime 50x ./internal/standalone/
	$(BENCH) 'UpInvoke' -benchtime 3000x ./internal/up/
	$(BENCH) 'UpFunctionThroughput' -benchtime 1x ./internal/up/
	$(BENCH) 'UpScaleFromZero' -benchtime 50x ./internal/up/
	$(BENCH) 'UpTasks300' -benchtime 5x ./internal/up/
	$(BENCH) 'UpCreate200|UpApply300' -benchtime 3x ./internal/up/
	$(BENCH) 'UpExec(RoundTrip|Setup)' -benchtime 2000x ./internal/up/
	$(BENCH) 'UpExecCLI' -benchtime 200x ./internal/up/
	$(BENCH) 'UpExecThroughput' -benchtime 3x ./internal/up/
	$(BENCH) 'UpDocker' -benchtime 200x ./internal/up/
	$(BENCH) 'UpThroughputDocker' -benchtime 3x ./internal/up/
	$(BENCH) 'TaskOutput100MB' -benchtime 3x ./e2e/
	$(BENCH) 'GitCheckout' -benchtime 100x ./internal/runtimed/
	$(BENCH) 'ArtifactStore' -benchtime 3x ./internal/artifact/
	$(BENCH) 'ArtifactMover' -benchtime 3x ./internal/artifact/
	$(BENCH) 'UpWorkflowSteps20' -benchtime 20x ./internal/up/
	$(BENCH) 'UpWorkflowFanOut100' -benchtime 3x ./internal/up/
	$(BENCH) . -benchtime $(BENCHTIME) ./internal/store/sqlite/
	$(BENCH) 'RunLifecycle' -benchtime 200x ./internal/store/kube/
	$(BENCH) 'BootstrapEcho' -benchtime 500x ./internal/lambda/bootstrap/
	$(BENCH) 'RegisterToReady' -benchtime 10x ./internal/lambda/
	$(BENCH) 'ServerInvoke' -benchtime 500x ./internal/lambda/
	$(BENCH) 'ExecAgentRoundTrip' -benchtime 2000x ./internal/lambda/
	$(BENCH) 'ExecAgentThroughput' -benchtime 3x ./internal/lambda/
	$(BENCH) 'TaskStartToAgent' -benchtime 10x ./internal/lambda/
	$(BENCH) 'LambdaInvoke' -benchtime 500x ./e2e/
	$(BENCH) 'Kube(Ceiling)?$$/Throughput' -benchtime 1x -timeout 40m ./e2e/
	$(BENCH) 'Kube$$/CreateToSucceeded' -benchtime 200x -timeout 30m ./e2e/
	$(BENCH) 'Kube$$/FunctionReady' -benchtime 50x -timeout 30m ./e2e/
	$(BENCH) 'Kube$$/ScaleFromZero' -benchtime 20x -timeout 30m ./e2e/
	$(BENCH) 'Kube$$/WorkflowFanOut100' -benchtime 3x -timeout 30m ./e2e/
	$(BENCH) 'KubeGateway' -benchtime 300x -timeout 30m ./e2e/
	$(BENCH) 'DockerOnCluster' -benchtime 20x -timeout 30m ./e2e/

lint:
	@unformatted=$$(gofmt -l .); if [ -n "$$unformatted" ]; then echo "gofmt needed:" $$unformatted; exit 1; fi
	$(GO) vet $(PKGS)
	$(TOOL) staticcheck $(PKGS)
	$(TOOL) buf lint

# A short run of every fuzz target beyond its checked-in seed corpus.
FUZZTIME ?= 20s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "fuzz $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf bin
