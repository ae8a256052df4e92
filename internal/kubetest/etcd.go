package kubetest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CompactEtcd compacts etcd's history up to its current revision, as the
// API server does every five minutes (--etcd-compaction-interval): a
// continue token or a watch from an older resourceVersion then fails with
// 410 Gone once the API server's own cache no longer holds it. It returns
// the revision compacted to.
func (c *Cluster) CompactEtcd(t testing.TB) int64 {
	t.Helper()
	rev, err := c.compactEtcd()
	if err != nil {
		t.Fatalf("kubetest: compact etcd: %v", err)
	}
	return rev
}

func (c *Cluster) compactEtcd() (int64, error) {
	pair, err := tls.LoadX509KeyPair(c.etcdClient.cert, c.etcdClient.key)
	if err != nil {
		return 0, err
	}
	caPEM, err := os.ReadFile(c.etcdClient.ca)
	if err != nil {
		return 0, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return 0, fmt.Errorf("no certificate in %s", c.etcdClient.ca)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{c.etcdClient.url},
		DialTimeout: 10 * time.Second,
		TLS:         &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: roots, MinVersion: tls.VersionTLS12},
	})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, c.etcdClient.url)
	if err != nil {
		return 0, err
	}
	rev := st.Header.Revision
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return 0, err
	}
	return rev, nil
}
