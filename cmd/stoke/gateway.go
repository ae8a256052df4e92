package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/internal/docker"
	"stoke.dev/stoke/internal/kubeconfig"
	"stoke.dev/stoke/internal/kubegateway"
	"stoke.dev/stoke/internal/version"
)

// defaultGatewayPort is the gateway's HTTPS port on its Pod IP.
const defaultGatewayPort = 8443

func newGatewayCommand() *cobra.Command {
	var cfg kubegateway.Config
	var kubeconfigPath, debugSocket, dockerImages string
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve invocations, exec sessions and Run logs in a Kubernetes cluster",
		Long: `gateway is Kubernetes mode's front door for invoke, exec and logs: the routes
of stoke up's gateway, over HTTPS. Every request's bearer token is checked by
the API server (a TokenReview, then a SubjectAccessReview for create on
runs/invoke or runs/exec, or get on runs/log, in the Run's namespace); the
answers are cached for at most 10 s. The same routes are the aggregated API
gateway.stoke.dev/v1alpha1 (the APIService the chart installs): the API
server authenticates and authorizes the caller, then proxies with the
front proxy's client certificate and the caller's identity in headers,
which the gateway trusts only with that certificate and authorizes with the
same SubjectAccessReview. Runs and runtime Pods are routed from
memory, and each call goes once to the owner Pod's runtimed over mutual TLS
with the certificate in --hop-tls-dir. /healthz and /readyz need no token;
/metrics needs get on the non-resource URL /metrics.

With --docker-listen it also serves the Docker Engine API over TLS
(docs/docker.md, "On Kubernetes"): DOCKER_HOST=tcp://HOST:PORT/namespaces/NS
with DOCKER_TLS_VERIFY=1 and a client certificate the cluster's client CA
signed (a kubeconfig user's) or a bearer token in the Docker CLI's
config.json HttpHeaders; containers are task Runs in NS (or
--docker-namespace), each request authorised on the Run with a
SubjectAccessReview.`,
		Example: `  stoke gateway --listen $(POD_IP):8443 --tls-cert-file /var/run/stoke-gateway/serving/tls.crt --tls-private-key-file /var/run/stoke-gateway/serving/tls.key`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rc, err := kubeconfig.Load(kubeconfigPath)
			if err != nil {
				return err
			}
			cfg.REST = rc
			cfg.Logger = slog.Default()
			if dockerImages != "" {
				if cfg.Docker.Images, err = docker.LoadImages(dockerImages); err != nil {
					return err
				}
			}
			cfg.Docker.Version = version.Get().Version
			if cfg.Listen == "" {
				ip := os.Getenv("POD_IP")
				if ip == "" {
					return fmt.Errorf("--listen is not set and POD_IP is empty")
				}
				cfg.Listen = net.JoinHostPort(ip, strconv.Itoa(defaultGatewayPort))
			}
			// The downward API's (the chart sets them): where the gateway's
			// Function load record goes.
			cfg.Pod = kubegateway.PodIdentity{Namespace: os.Getenv("POD_NAMESPACE"), Name: os.Getenv("POD_NAME"), UID: types.UID(os.Getenv("POD_UID"))}
			stop, err := serveDebug(debugSocket)
			if err != nil {
				return err
			}
			defer stop()
			return kubegateway.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig file (default: the Pod's service account)")
	f.StringVar(&cfg.Listen, "listen", "", "the HTTPS address (default $POD_IP:8443)")
	f.StringVar(&cfg.CertFile, "tls-cert-file", "", "the serving certificate (PEM); with --tls-private-key-file. Neither: a self-signed one made at start")
	f.StringVar(&cfg.KeyFile, "tls-private-key-file", "", "the serving certificate's key (PEM)")
	f.StringVar(&cfg.HopTLSDir, "hop-tls-dir", "/var/run/stoke-gateway/hop", "the client certificate for runtimed's hop: ca.crt, tls.crt, tls.key (the Secret stoke-gateway-tls)")
	f.IntVar(&cfg.HopPort, "hop-port", kubegateway.DefaultHopPort, "runtimed's hop port on a runtime Pod's IP")
	f.StringSliceVar(&cfg.TokenAudiences, "token-audiences", nil, "the audiences a caller's token must be for, asked for in each TokenReview (default: the API server's own, as kubectl's and ServiceAccount tokens have)")
	f.BoolVar(&cfg.FrontProxy, "front-proxy", true, "serve callers the API server proxies to the aggregated API gateway.stoke.dev/v1alpha1 (their identity from the front proxy's headers, trusted with its client certificate as kube-system/extension-apiserver-authentication says)")
	f.DurationVar(&cfg.AuthTTL, "auth-cache-ttl", kubegateway.MaxDecisionTTL, "how long an authentication or authorization answer is kept (at most 10s)")
	f.StringVar(&cfg.Docker.Listen, "docker-listen", "", "serve the Docker Engine API over TLS at this address ($POD_IP:2376 in the chart; empty: not served)")
	f.StringVar(&cfg.Docker.ClientCAFile, "docker-client-ca-file", "", "the CA (PEM) of the Docker port's client certificates (default: the cluster's client CA, client-ca-file in kube-system/extension-apiserver-authentication)")
	f.StringVar(&dockerImages, "docker-images", "", "file of the Docker image → Runtime table (YAML; see docs/docker.md); default: python:* → python, bash/debian/ubuntu/alpine/busybox → bash")
	f.StringVar(&cfg.Docker.Namespace, "docker-namespace", "default", "the namespace of the containers of Docker clients whose host names none (tcp://HOST:PORT/namespaces/NS names one)")
	addArtifactS3Flags(f, &cfg.ArtifactS3, "no artifact store, and upload-artifact/download-artifact steps fail")
	f.StringVar(&debugSocket, "debug-socket", "/var/run/stoke-gateway/run/debug/debug.sock", debugSocketUsage)
	return cmd
}
