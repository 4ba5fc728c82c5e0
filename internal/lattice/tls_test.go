package lattice_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/manifest"
)

// selfSigned writes a self-signed ECDSA certificate for 127.0.0.1 and
// localhost, and its key, as PEM files in dir.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestMemberEmbeddedTLS: with tls_cert and tls_key the embedded server
// speaks TLS only: a plain connection and a TLS connection that does not
// trust its certificate are refused; a second member with tls_ca joins
// over TLS and routes a call to the first's session.
func TestMemberEmbeddedTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir, "lattice")
	lt := lattice.Config{Name: "tls", Embedded: true, Listen: "127.0.0.1:0", StoreDir: filepath.Join(dir, "js"),
		TLSCA: cert, TLSCert: cert, TLSKey: key, HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}
	d := openDeployment(t, manifestOpts{instances: 1})
	ctx := context.Background()
	m, err := lattice.Join(ctx, d.Deployment, lattice.MemberConfig{Lattice: lt, HostID: "one", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	if nc, err := nats.Connect(m.ClientURL(), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("the TLS embedded server took a plain connection")
	}
	otherCert, _ := selfSigned(t, dir, "other")
	if nc, err := nats.Connect(m.ClientURL(), nats.RootCAs(otherCert), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Fatal("a client that does not trust the server's certificate connected")
	}
	// A plain TLS client that trusts it connects (the server asks for no
	// client certificate).
	pool := x509.NewCertPool()
	b, _ := os.ReadFile(cert)
	pool.AppendCertsFromPEM(b)
	nc, err := nats.Connect(m.ClientURL(), nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatalf("a TLS client trusting the certificate: %v", err)
	}
	nc.Close()

	front, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: lattice.Config{Name: "tls", URL: m.ClientURL(), TLSCA: cert,
		HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}, HostID: "front", Logger: quietLogger()})
	if err != nil {
		t.Fatalf("a member with tls_ca: %v", err)
	}
	defer front.Close()
	if err := front.Front().WaitFor(ctx, func() bool { return len(front.Front().Serving("steady")) == 1 }); err != nil {
		t.Fatal(err)
	}
	if out, _, err := front.Call(ctx, "steady", nil); err != nil || string(out) != "ok" {
		t.Fatalf("a call over TLS: %q, %v", out, err)
	}
	if st := front.Stats(); st["remote"] != 1 {
		t.Errorf("stats %v; want the call routed through the lattice", st)
	}
	// A member whose tls_ca does not hold the server's certificate cannot
	// join.
	if bad, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: lattice.Config{Name: "tls", URL: m.ClientURL(), TLSCA: otherCert,
		HeartbeatTTL: time.Second, ClaimTTL: manifest.DefaultClaimTTL, FenceFailures: 3}, HostID: "bad", Logger: quietLogger()}); err == nil {
		bad.Close()
		t.Fatal("a member that does not trust the server joined")
	}
}
