// AMQPS with amqp091-go: a TLS connection verified against the test CA,
// logging in with EXTERNAL by the client certificate (CN=guest), then a
// confirmed publish and a get over it. tests/clients/broker.sh starts
// berth with the certificates it generates and sets BERTH_TEST_AMQPS_URI
// and BERTH_TEST_TLS_DIR; against another broker the test is skipped.
package smoke

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestTLSWithClientCertificateAndExternalLogin(t *testing.T) {
	uri, dir := os.Getenv("BERTH_TEST_AMQPS_URI"), os.Getenv("BERTH_TEST_TLS_DIR")
	if uri == "" || dir == "" {
		t.Skip("no AMQPS listener (BERTH_TEST_AMQPS_URI unset)")
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	must(t, err, "read ca.crt")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.crt holds no certificate")
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	must(t, err, "load client certificate")
	cfg := &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, ServerName: "localhost"}
	conn, err := amqp.DialConfig(uri, amqp.Config{
		TLSClientConfig: cfg,
		SASL:            []amqp.Authentication{&amqp.ExternalAuth{}},
		Dial:            amqp.DefaultDial(waitMax),
	})
	must(t, err, "dial "+uri+" with EXTERNAL")
	t.Cleanup(func() { _ = conn.Close() })
	ch := channel(t, conn, true)
	q := exclusiveQueue(t, ch, "tls")
	publishConfirmed(t, ch, "", q, false, amqp.Publishing{Body: []byte("over tls")})
	deadline := time.Now().Add(waitMax)
	for {
		d, ok, err := ch.Get(q, true)
		must(t, err, "basic.get")
		if ok {
			if string(d.Body) != "over tls" {
				t.Fatalf("got %q", d.Body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("message did not arrive")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
