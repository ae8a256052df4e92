package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// readsServiceAccount answers what a handler finds of a ServiceAccount
// token, and its container's mounts.
const readsServiceAccount = `import os

DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

def handle(event):
    out = {"exists": os.path.exists(DIR), "mounts": open("/proc/self/mountinfo").read()}
    if out["exists"]:
        out["token"] = open(DIR + "/token").read()
        out["namespace"] = open(DIR + "/namespace").read()
        out["ca"] = open(DIR + "/ca.crt").read()
    return out
`

type saAnswer struct {
	Exists    bool   `json:"exists"`
	Mounts    string `json:"mounts"`
	Token     string `json:"token"`
	Namespace string `json:"namespace"`
	CA        string `json:"ca"`
}

// A Runtime whose template names a ServiceAccount: users' code in its
// runtime-server container reads a token there whose TokenReview answers
// that ServiceAccount, for the API server's own audience, with the
// namespace and the API server's CA beside it; the same code on a Runtime
// without one finds no token directory at all. In neither is runtimed's
// token (the Pod's ServiceAccount, stoke-runtimed) among the container's
// mounts, and the Pod's ServiceAccount is still stoke-runtimed. A
// template that names stoke-runtimed is refused by the API server.
func testServiceAccountToken(t *testing.T, e *kubeEnv) {
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: runsNamespace, Name: "reader"}}
	if _, err := e.kube.CoreV1().ServiceAccounts(runsNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.kube.CoreV1().ServiceAccounts(runsNamespace).Delete(context.Background(), sa.Name, metav1.DeleteOptions{})
	})
	rt := &v1alpha1.Runtime{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime},
		ObjectMeta: metav1.ObjectMeta{Namespace: runsNamespace, Name: "python-sa"},
		Spec: v1alpha1.RuntimeSpec{Server: "python", Replicas: 1, Runs: 2,
			Template: &v1alpha1.RuntimeTemplate{ServiceAccountName: sa.Name}},
	}
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(rt).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.stoke.Delete().Namespace(runsNamespace).Resource("runtimes").Name(rt.Name).Do(context.Background()).Error()
	})
	e.awaitRuntimesReady(t, installBound)

	runs := e.watchRuns(t, "e2e=service-account")
	e.mustCreateRun(t, labelled(newRun("with-sa", noRetry(function("python-sa", "fn.handle", "fn.py", readsServiceAccount))), "service-account"))
	e.mustCreateRun(t, labelled(newRun("without-sa", noRetry(function("python", "fn.handle", "fn.py", readsServiceAccount))), "service-account"))
	got := runs.until(t, runBound, "with-sa and without-sa Ready", func(m map[string]*v1alpha1.Run) bool {
		for _, n := range []string{"with-sa", "without-sa"} {
			if phaseOf(m, n) != v1alpha1.PhaseReady && !terminal(phaseOf(m, n)) {
				return false
			}
		}
		return true
	})
	defer e.deleteRun(t, "with-sa")
	defer e.deleteRun(t, "without-sa")
	creds := e.gatewayCredentials(t)
	answer := func(name string) saAnswer {
		t.Helper()
		run := got[name]
		if run.Status.Phase != v1alpha1.PhaseReady {
			t.Fatalf("%s: %s %s %s", name, run.Status.Phase, run.Status.Reason, run.Status.Message)
		}
		pod := e.pod(t, runsNamespace, run.Status.AssignedPod)
		if pod.Spec.ServiceAccountName != "stoke-runtimed" {
			t.Errorf("%s's pod runs as ServiceAccount %q, want stoke-runtimed", name, pod.Spec.ServiceAccountName)
		}
		for _, m := range pod.Spec.Containers[0].VolumeMounts {
			if m.Name == "kube-api-access" {
				t.Errorf("%s's runtime-server container mounts runtimed's token (%s at %s)", name, m.Name, m.MountPath)
			}
		}
		resp, err := invokeHop(e.gatewayConn(t, creds, run), run, `{}`)
		if err != nil {
			t.Fatal(err)
		}
		var a saAnswer
		if err := json.Unmarshal(resp.GetOutput(), &a); err != nil {
			t.Fatalf("%s answered %s: %v", name, resp.GetOutput(), err)
		}
		if strings.Contains(a.Mounts, "kube-api-access") {
			t.Errorf("%s's container mounts runtimed's token:\n%s", name, a.Mounts)
		}
		return a
	}

	with := answer("with-sa")
	if !with.Exists || with.Token == "" {
		t.Fatalf("with-sa finds no token (exists %v)", with.Exists)
	}
	if with.Namespace != runsNamespace || !strings.Contains(with.CA, "BEGIN CERTIFICATE") {
		t.Errorf("with-sa: namespace %q, ca.crt %q", with.Namespace, with.CA)
	}
	tr, err := e.kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: with.Token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:serviceaccount:" + runsNamespace + ":" + sa.Name; !tr.Status.Authenticated || tr.Status.User.Username != want {
		t.Errorf("the token with-sa read reviews as %+v, want %s", tr.Status, want)
	}
	if len(tr.Status.Audiences) == 0 {
		t.Errorf("the token with-sa read is not for the API server's audience: %+v", tr.Status)
	}

	if without := answer("without-sa"); without.Exists || without.Token != "" {
		t.Errorf("without-sa, on a Runtime without a serviceAccountName, finds a token directory")
	}

	// Naming runtimed's ServiceAccount is refused, and nothing is made.
	bad := rt.DeepCopy()
	bad.Name, bad.ResourceVersion, bad.UID = "python-runtimed-sa", "", ""
	bad.Spec.Template.ServiceAccountName = "stoke-runtimed"
	err = e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(bad).Do(ctx).Error()
	if err == nil || !strings.Contains(err.Error(), "spec.template.serviceAccountName") || !strings.Contains(err.Error(), "Stoke's own ServiceAccounts") {
		t.Errorf("a template naming stoke-runtimed: %v, want refused at spec.template.serviceAccountName", err)
	}
}
