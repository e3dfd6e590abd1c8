// Smoke test: the amqp091-go client against the broker at BERTH_TEST_URI.
//
// Pins what a Go application relies on: publisher confirms, manual acks,
// topic routing with `*` and `#`, and mandatory publishes coming back as
// basic.return 312 NO_ROUTE. Every name is unique so the test can share a
// broker with others; every wait is bounded (and `go test -timeout` bounds
// the calls the client library offers no timeout for).
package smoke

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"reflect"
	"sort"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// waitMax is the longest any single expected event may take.
const waitMax = 10 * time.Second

func unique(what string) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return fmt.Sprintf("smoke.go.%s.%s", what, hex.EncodeToString(b))
}

// dial connects to BERTH_TEST_URI and closes the connection when t ends.
func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	uri := os.Getenv("BERTH_TEST_URI")
	if uri == "" {
		t.Fatal("BERTH_TEST_URI must be set (tests/go/run.sh sets it)")
	}
	conn, err := amqp.DialConfig(uri, amqp.Config{Dial: amqp.DefaultDial(waitMax)})
	if err != nil {
		t.Fatalf("dial %s: %v", uri, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func channel(t *testing.T, conn *amqp.Connection, confirm bool) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	must(t, err, "channel.open")
	if confirm {
		must(t, ch.Confirm(false), "confirm.select")
	}
	return ch
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// exclusiveQueue declares a server-side-unique exclusive queue.
func exclusiveQueue(t *testing.T, ch *amqp.Channel, what string) string {
	t.Helper()
	q, err := ch.QueueDeclare(unique(what), false, false, true, false, nil)
	must(t, err, "queue.declare")
	return q.Name
}

// publishConfirmed publishes and waits for the broker's ack of that message.
func publishConfirmed(t *testing.T, ch *amqp.Channel, exchange, key string, mandatory bool, msg amqp.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitMax)
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, msg)
	must(t, err, "basic.publish")
	acked, err := dc.WaitContext(ctx)
	must(t, err, fmt.Sprintf("confirm of message to %q/%q", exchange, key))
	if !acked {
		t.Fatalf("message to %q/%q was nacked, expected ack", exchange, key)
	}
}

// drain empties queue with basic.get and returns the messages in order.
func drain(t *testing.T, ch *amqp.Channel, queue string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		msg, ok, err := ch.Get(queue, true)
		must(t, err, "basic.get")
		if !ok {
			return out
		}
		out = append(out, msg)
	}
}

func TestPublisherConfirmsAckEveryMessage(t *testing.T) {
	conn := dial(t)
	ch := channel(t, conn, true)
	queue := exclusiveQueue(t, ch, "confirms")
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 100))

	const count = 50
	ctx, cancel := context.WithTimeout(context.Background(), waitMax)
	defer cancel()
	for i := 0; i < count; i++ {
		err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			Body:         []byte(fmt.Sprintf("m%d", i)),
		})
		must(t, err, "basic.publish")
	}
	// One Confirmation per message, in order, even when the broker acks with multiple=true.
	deadline := time.After(waitMax)
	for want := uint64(1); want <= count; want++ {
		select {
		case c := <-confirms:
			if c.DeliveryTag != want || !c.Ack {
				t.Fatalf("confirmation %+v, want ack of delivery tag %d", c, want)
			}
		case <-deadline:
			t.Fatalf("timed out waiting for confirm %d of %d", want, count)
		}
	}
	q, err := ch.QueueDeclarePassive(queue, false, false, true, false, nil)
	must(t, err, "queue.declare passive")
	if q.Messages != count {
		t.Fatalf("queue holds %d messages after %d confirms", q.Messages, count)
	}
}

func TestManualAcksDeliverEveryMessageOnceAndRemoveIt(t *testing.T) {
	conn := dial(t)
	publisher := channel(t, conn, true)
	queue := exclusiveQueue(t, publisher, "acks")
	const count = 30
	for i := 0; i < count; i++ {
		publishConfirmed(t, publisher, "", queue, false, amqp.Publishing{
			ContentType: "text/plain",
			Headers:     amqp.Table{"x-index": int32(i)},
			Body:        []byte(fmt.Sprintf("body-%d", i)),
		})
	}

	consumer := channel(t, conn, false)
	must(t, consumer.Qos(10, 0, false), "basic.qos")
	deliveries, err := consumer.Consume(queue, "smoke-go", false, false, false, false, nil)
	must(t, err, "basic.consume")
	deadline := time.After(waitMax)
	for i := 0; i < count; i++ {
		select {
		case d, ok := <-deliveries:
			if !ok {
				t.Fatalf("delivery channel closed after %d of %d messages", i, count)
			}
			if got, want := string(d.Body), fmt.Sprintf("body-%d", i); got != want {
				t.Fatalf("delivery %d has body %q, want %q (all messages, in publish order)", i, got, want)
			}
			if d.DeliveryTag != uint64(i+1) || d.Redelivered || d.RoutingKey != queue ||
				d.ContentType != "text/plain" || d.Headers["x-index"] != int32(i) || d.ConsumerTag != "smoke-go" {
				t.Fatalf("delivery %d: unexpected fields %+v", i, d)
			}
			must(t, d.Ack(false), "basic.ack")
		case <-deadline:
			t.Fatalf("timed out after %d of %d deliveries", i, count)
		}
	}
	must(t, consumer.Cancel("smoke-go", false), "basic.cancel")
	// Had any ack been lost, closing the channel would requeue that message.
	must(t, consumer.Close(), "channel.close")
	q, err := publisher.QueueDeclarePassive(queue, false, false, true, false, nil)
	must(t, err, "queue.declare passive")
	if q.Messages != 0 || q.Consumers != 0 {
		t.Fatalf("after acking all: %d messages, %d consumers; want 0, 0", q.Messages, q.Consumers)
	}
}

func TestTopicExchangeRoutesByStarAndHash(t *testing.T) {
	conn := dial(t)
	ch := channel(t, conn, true)
	exchange := unique("topic")
	must(t, ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil), "exchange.declare")
	star := exclusiveQueue(t, ch, "star")
	hash := exclusiveQueue(t, ch, "hash")
	tail := exclusiveQueue(t, ch, "tail")
	must(t, ch.QueueBind(star, "stock.*.nyse", exchange, false, nil), "queue.bind")
	must(t, ch.QueueBind(hash, "stock.#", exchange, false, nil), "queue.bind")
	must(t, ch.QueueBind(tail, "#.error", exchange, false, nil), "queue.bind")

	for _, key := range []string{"stock.ibm.nyse", "stock.ibm.x.nyse", "stock", "stock.nyse",
		"app.db.error", "error", "bond.ibm.nyse", "stockx.ibm.nyse"} {
		publishConfirmed(t, ch, exchange, key, false, amqp.Publishing{Body: []byte(key)})
	}

	keysIn := func(queue string) []string {
		keys := []string{}
		for _, d := range drain(t, ch, queue) {
			keys = append(keys, d.RoutingKey)
		}
		sort.Strings(keys)
		return keys
	}
	for _, c := range []struct {
		queue, pattern string
		want           []string
	}{
		{star, "stock.*.nyse", []string{"stock.ibm.nyse"}},
		{hash, "stock.#", []string{"stock", "stock.ibm.nyse", "stock.ibm.x.nyse", "stock.nyse"}},
		{tail, "#.error", []string{"app.db.error", "error"}},
	} {
		if got := keysIn(c.queue); !reflect.DeepEqual(got, c.want) {
			t.Errorf("binding %q received %v, want %v", c.pattern, got, c.want)
		}
	}
	must(t, ch.ExchangeDelete(exchange, false, false), "exchange.delete")
}

func TestMandatoryUnroutablePublishIsReturnedNoRoute(t *testing.T) {
	conn := dial(t)
	ch := channel(t, conn, true)
	exchange := unique("direct")
	must(t, ch.ExchangeDeclare(exchange, "direct", false, true, false, false, nil), "exchange.declare")
	queue := exclusiveQueue(t, ch, "routed")
	must(t, ch.QueueBind(queue, "routed", exchange, false, nil), "queue.bind")
	returns := ch.NotifyReturn(make(chan amqp.Return, 10))

	publishConfirmed(t, ch, exchange, "nowhere", true, amqp.Publishing{MessageId: "unroutable", Body: []byte("lost")})
	select {
	case r := <-returns:
		if r.ReplyCode != 312 || r.ReplyText != "NO_ROUTE" || r.Exchange != exchange ||
			r.RoutingKey != "nowhere" || string(r.Body) != "lost" || r.MessageId != "unroutable" {
			t.Fatalf("basic.return %d %q exchange=%q key=%q body=%q id=%q; want 312 NO_ROUTE for the published message",
				r.ReplyCode, r.ReplyText, r.Exchange, r.RoutingKey, r.Body, r.MessageId)
		}
	case <-time.After(waitMax):
		t.Fatal("timed out waiting for basic.return of the unroutable mandatory message")
	}

	// A routable mandatory message is delivered, not returned.
	publishConfirmed(t, ch, exchange, "routed", true, amqp.Publishing{Body: []byte("kept")})
	got := drain(t, ch, queue)
	if len(got) != 1 || string(got[0].Body) != "kept" {
		t.Fatalf("routed queue holds %d messages, want just \"kept\"", len(got))
	}
	select {
	case r := <-returns:
		t.Fatalf("routable mandatory message was returned: %d %s", r.ReplyCode, r.ReplyText)
	default:
	}
	must(t, ch.ExchangeDelete(exchange, false, false), "exchange.delete")
}
