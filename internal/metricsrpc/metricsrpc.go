// Package metricsrpc carries Prometheus metrics over a gRPC connection a
// process already has, so that a role without an HTTP port (a Runtime
// Server in standalone mode, on a Unix socket in a 0700 directory) needs no
// second socket: Server serves a registry on the metrics.v1 service, and
// Gatherer scrapes a changing set of such servers into one
// prometheus.Gatherer, each series labelled with where it came from.
package metricsrpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	metricsv1 "stoke.dev/stoke/api/metrics/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
)

// Server serves a Gatherer's metrics on metrics.v1.MetricsService.
type Server struct {
	metricsv1.UnimplementedMetricsServiceServer
	g prometheus.Gatherer
}

// NewServer returns a Server for g.
func NewServer(g prometheus.Gatherer) *Server { return &Server{g: g} }

// Scrape implements metricsv1.MetricsServiceServer.
func (s *Server) Scrape(context.Context, *metricsv1.ScrapeRequest) (*metricsv1.ScrapeResponse, error) {
	mfs, err := s.g.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather metrics: %w", err)
	}
	var buf bytes.Buffer
	for _, mf := range mfs {
		if _, err := protodelim.MarshalTo(&buf, mf); err != nil {
			return nil, fmt.Errorf("encode metrics: %w", err)
		}
		if buf.Len() > bounds.MetricsScrape {
			return nil, errdefs.Errorf(errdefs.ErrTooLarge, "metrics: more than %d bytes", bounds.MetricsScrape)
		}
	}
	return &metricsv1.ScrapeResponse{MetricFamilies: buf.Bytes()}, nil
}

// Scrape calls conn's metrics.v1 service and decodes its families.
func Scrape(ctx context.Context, conn grpc.ClientConnInterface) ([]*dto.MetricFamily, error) {
	resp, err := metricsv1.NewMetricsServiceClient(conn).Scrape(ctx, &metricsv1.ScrapeRequest{},
		grpc.MaxCallRecvMsgSize(bounds.MetricsScrape+4<<10))
	if err != nil {
		return nil, err
	}
	r := bytes.NewReader(resp.GetMetricFamilies())
	var mfs []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		err := protodelim.UnmarshalFrom(r, mf)
		if errors.Is(err, io.EOF) {
			return mfs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode metrics: %w", err)
		}
		mfs = append(mfs, mf)
	}
}

// Target is one server to scrape: its connection and the labels its
// series get (for example pod and runtime). Labels must be the same names
// for every target and must not be labels the server sets itself.
type Target struct {
	Conn   grpc.ClientConnInterface
	Labels map[string]string
}

// Gatherer scrapes every current target on each Gather, in parallel, and
// merges their families. A target that does not answer within the timeout
// is left out of that scrape; the up gauge (UpName) then reports it 0.
type Gatherer struct {
	targets func() []Target
	timeout time.Duration
	log     *slog.Logger
	// upName and upHelp name the up gauge (UpName by default).
	upName, upHelp string
}

// UpName is the gauge a Gatherer adds: 1 for each target scraped, 0 for
// each that failed.
const UpName = "stoke_runtime_server_up"

// NewGatherer returns a Gatherer of the targets listed by targets at each
// scrape.
func NewGatherer(targets func() []Target, timeout time.Duration, log *slog.Logger) *Gatherer {
	return &Gatherer{targets: targets, timeout: timeout, log: logging.OrDiscard(log),
		upName: UpName, upHelp: "Whether the last scrape of a Runtime Server's metrics succeeded."}
}

// WithUp names the up gauge for targets that are not Runtime Servers (the
// gateway's scrape of runtimed); it returns g.
func (g *Gatherer) WithUp(name, help string) *Gatherer {
	g.upName, g.upHelp = name, help
	return g
}

// Gather implements prometheus.Gatherer. It never fails: a target that
// cannot be scraped is logged and shown by UpName.
func (g *Gatherer) Gather() ([]*dto.MetricFamily, error) {
	targets := g.targets()
	results := make([][]*dto.MetricFamily, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
			defer cancel()
			mfs, err := Scrape(ctx, t.Conn)
			if err != nil {
				g.log.Warn("scraping a runtime server's metrics", "labels", t.Labels, "error", err)
				return
			}
			results[i] = mfs
		})
	}
	wg.Wait()

	byName := map[string]*dto.MetricFamily{}
	upFamily := &dto.MetricFamily{Name: proto.String(g.upName), Type: dto.MetricType_GAUGE.Enum(),
		Help: proto.String(g.upHelp)}
	for i, t := range targets {
		labels := labelPairs(t.Labels)
		up := 0.0
		if results[i] != nil {
			up = 1
		}
		upFamily.Metric = append(upFamily.Metric, &dto.Metric{Label: labels, Gauge: &dto.Gauge{Value: proto.Float64(up)}})
		for _, mf := range results[i] {
			merged := byName[mf.GetName()]
			if merged == nil {
				merged = &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit}
				byName[mf.GetName()] = merged
			} else if merged.GetType() != mf.GetType() {
				g.log.Warn("runtime servers disagree on a metric's type; dropping one", "metric", mf.GetName())
				continue
			}
			for _, m := range mf.Metric {
				m.Label = append(slices.Clone(labels), m.Label...)
				sort.Slice(m.Label, func(a, b int) bool { return m.Label[a].GetName() < m.Label[b].GetName() })
				merged.Metric = append(merged.Metric, m)
			}
		}
	}
	var out []*dto.MetricFamily
	if len(upFamily.Metric) > 0 { // a family without metrics cannot be exposed
		out = append(out, upFamily)
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[name])
	}
	return out, nil
}

func labelPairs(m map[string]string) []*dto.LabelPair {
	var out []*dto.LabelPair
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, &dto.LabelPair{Name: proto.String(k), Value: proto.String(m[k])})
	}
	return out
}
