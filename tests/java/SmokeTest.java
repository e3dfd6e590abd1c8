// Smoke test: the Java com.rabbitmq:amqp-client against the broker at
// BERTH_TEST_URI.
//
// Pins what a Java application relies on: publisher confirms, manual acks,
// topic routing with `*` and `#`, and mandatory publishes coming back as
// basic.return 312 NO_ROUTE. Every name is unique so the test can share a
// broker with others. Every wait is bounded: the client's RPC, connection and
// handshake timeouts, explicit waits below, and a per-test deadline.
//
// A plain program rather than a JUnit suite keeps the install to the client
// jars: it prints one PASS/FAIL line per test and exits non-zero on failure.

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.CancelCallback;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.ConfirmListener;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.Delivery;
import com.rabbitmq.client.GetResponse;
import com.rabbitmq.client.MessageProperties;
import com.rabbitmq.client.Return;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

public final class SmokeTest {
    /** Longest any single expected event or RPC may take. */
    static final int WAIT_MS = 10_000;
    /** Longest any one test may take. */
    static final int TEST_MS = 30_000;

    interface Body {
        void run(Connection connection) throws Exception;
    }

    public static void main(String[] args) throws Exception {
        String uri = System.getenv("BERTH_TEST_URI");
        if (uri == null || uri.isEmpty()) {
            System.err.println("BERTH_TEST_URI must be set (tests/java/run.sh sets it)");
            System.exit(2);
        }
        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(uri);
        // By the AMQP URI spec the Java client reads "amqp://host:port/" as the
        // vhost "" (not "/"), which brokers refuse with 530; the other clients
        // read it as "/". Keep the meaning the other smoke tests give it.
        String path = java.net.URI.create(uri).getRawPath();
        if (path == null || path.isEmpty() || path.equals("/")) {
            factory.setVirtualHost("/");
        }
        factory.setConnectionTimeout(WAIT_MS);
        factory.setHandshakeTimeout(WAIT_MS);
        factory.setChannelRpcTimeout(WAIT_MS);
        factory.setShutdownTimeout(WAIT_MS);
        factory.setAutomaticRecoveryEnabled(false);

        Map<String, Body> tests = new LinkedHashMap<>();
        tests.put("publisher confirms ack every published message", SmokeTest::publisherConfirms);
        tests.put("manual acks deliver every message once and remove it", SmokeTest::manualAcks);
        tests.put("topic exchange routes by * and # and drops non-matching keys", SmokeTest::topicRouting);
        tests.put("mandatory unroutable publish is returned 312 NO_ROUTE", SmokeTest::mandatoryReturn);

        int passed = 0;
        int failed = 0;
        ExecutorService runner = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "smoke-test");
            t.setDaemon(true); // a stuck test must not keep the JVM alive
            return t;
        });
        for (Map.Entry<String, Body> test : tests.entrySet()) {
            Future<?> outcome = runner.submit(() -> {
                try (Connection connection = factory.newConnection("berth-java-smoke")) {
                    test.getValue().run(connection);
                }
                return null;
            });
            try {
                outcome.get(TEST_MS, TimeUnit.MILLISECONDS);
                System.out.println("PASS " + test.getKey());
                passed++;
            } catch (TimeoutException e) {
                outcome.cancel(true);
                System.out.println("FAIL " + test.getKey() + ": timed out after " + TEST_MS + " ms");
                failed++;
            } catch (ExecutionException e) {
                System.out.println("FAIL " + test.getKey() + ": " + e.getCause());
                e.getCause().printStackTrace(System.out);
                failed++;
            }
        }
        System.out.println("java: " + passed + " passed, " + failed + " failed");
        System.exit(failed == 0 ? 0 : 1);
    }

    static String unique(String what) {
        return "smoke.java." + what + "." + UUID.randomUUID();
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }

    static void checkEqual(Object actual, Object expected, String what) {
        if (!Objects.equals(actual, expected)) {
            throw new AssertionError(what + ": expected <" + expected + "> but was <" + actual + ">");
        }
    }

    static String exclusiveQueue(Channel channel, String what) throws Exception {
        return channel.queueDeclare(unique(what), false, true, false, null).getQueue();
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String text(byte[] body) {
        return new String(body, StandardCharsets.UTF_8);
    }

    /** Empties queue with basic.get and returns the messages in order. */
    static List<GetResponse> drain(Channel channel, String queue) throws Exception {
        List<GetResponse> out = new ArrayList<>();
        for (GetResponse r; (r = channel.basicGet(queue, true)) != null; ) {
            out.add(r);
        }
        return out;
    }

    static void publisherConfirms(Connection connection) throws Exception {
        Channel channel = connection.createChannel();
        channel.confirmSelect();
        String queue = exclusiveQueue(channel, "confirms");
        int count = 50;
        // Every sequence number 1..count must be acked, singly or with multiple=true.
        boolean[] acked = new boolean[count + 1];
        List<Long> nacked = new CopyOnWriteArrayList<>();
        channel.addConfirmListener(new ConfirmListener() {
            @Override
            public void handleAck(long tag, boolean multiple) {
                synchronized (acked) {
                    for (long t = multiple ? 1 : tag; t <= tag && t <= count; t++) {
                        acked[(int) t] = true;
                    }
                }
            }

            @Override
            public void handleNack(long tag, boolean multiple) {
                nacked.add(tag);
            }
        });
        for (int i = 0; i < count; i++) {
            channel.basicPublish("", queue, MessageProperties.PERSISTENT_BASIC, utf8("m" + i));
        }
        channel.waitForConfirmsOrDie(WAIT_MS);
        checkEqual(nacked, List.of(), "nacked delivery tags");
        synchronized (acked) {
            for (int t = 1; t <= count; t++) {
                check(acked[t], "message with publish sequence number " + t + " was acked");
            }
        }
        checkEqual(channel.queueDeclarePassive(queue).getMessageCount(), count,
                "messages in the queue after every confirm");
        channel.close();
    }

    static void manualAcks(Connection connection) throws Exception {
        Channel publisher = connection.createChannel();
        publisher.confirmSelect();
        String queue = exclusiveQueue(publisher, "acks");
        int count = 30;
        for (int i = 0; i < count; i++) {
            AMQP.BasicProperties props = new AMQP.BasicProperties.Builder()
                    .contentType("text/plain")
                    .headers(Map.of("x-index", i))
                    .build();
            publisher.basicPublish("", queue, props, utf8("body-" + i));
        }
        publisher.waitForConfirmsOrDie(WAIT_MS);

        Channel consumer = connection.createChannel();
        consumer.basicQos(10);
        List<Delivery> received = new CopyOnWriteArrayList<>();
        CountDownLatch allReceived = new CountDownLatch(count);
        List<String> cancelled = new CopyOnWriteArrayList<>();
        String tag = consumer.basicConsume(queue, false, "smoke-java", (consumerTag, delivery) -> {
            received.add(delivery);
            consumer.basicAck(delivery.getEnvelope().getDeliveryTag(), false);
            allReceived.countDown();
        }, (CancelCallback) cancelled::add);
        checkEqual(tag, "smoke-java", "consumer tag");
        check(allReceived.await(WAIT_MS, TimeUnit.MILLISECONDS),
                "all " + count + " deliveries within " + WAIT_MS + " ms (got " + received.size() + ")");
        consumer.basicCancel(tag);
        checkEqual(cancelled, List.of(), "consumers cancelled by the broker");

        checkEqual(received.size(), count, "deliveries");
        for (int i = 0; i < count; i++) {
            Delivery d = received.get(i);
            checkEqual(text(d.getBody()), "body-" + i, "delivery " + i + " (all messages, in publish order)");
            checkEqual(d.getEnvelope().getDeliveryTag(), (long) i + 1, "delivery tag of delivery " + i);
            checkEqual(d.getEnvelope().isRedeliver(), false, "redelivered flag of delivery " + i);
            checkEqual(d.getEnvelope().getRoutingKey(), queue, "routing key of delivery " + i);
            checkEqual(d.getProperties().getContentType(), "text/plain", "content type of delivery " + i);
            checkEqual(d.getProperties().getHeaders().get("x-index"), i, "x-index header of delivery " + i);
        }
        // Had any ack been lost, closing the channel would requeue that message.
        consumer.close();
        AMQP.Queue.DeclareOk after = publisher.queueDeclarePassive(queue);
        checkEqual(after.getMessageCount(), 0, "messages left after acking all");
        checkEqual(after.getConsumerCount(), 0, "consumers left after cancel");
        publisher.close();
    }

    static void topicRouting(Connection connection) throws Exception {
        Channel channel = connection.createChannel();
        channel.confirmSelect();
        String exchange = unique("topic");
        channel.exchangeDeclare(exchange, "topic", false, true, null);
        String star = exclusiveQueue(channel, "star");
        String hash = exclusiveQueue(channel, "hash");
        String tail = exclusiveQueue(channel, "tail");
        channel.queueBind(star, exchange, "stock.*.nyse");
        channel.queueBind(hash, exchange, "stock.#");
        channel.queueBind(tail, exchange, "#.error");
        for (String key : List.of("stock.ibm.nyse", "stock.ibm.x.nyse", "stock", "stock.nyse",
                "app.db.error", "error", "bond.ibm.nyse", "stockx.ibm.nyse")) {
            channel.basicPublish(exchange, key, null, utf8(key));
        }
        channel.waitForConfirmsOrDie(WAIT_MS);

        checkEqual(keysIn(channel, star), List.of("stock.ibm.nyse"), "keys routed by stock.*.nyse");
        checkEqual(keysIn(channel, hash), List.of("stock", "stock.ibm.nyse", "stock.ibm.x.nyse", "stock.nyse"),
                "keys routed by stock.#");
        checkEqual(keysIn(channel, tail), List.of("app.db.error", "error"), "keys routed by #.error");
        channel.exchangeDelete(exchange);
        channel.close();
    }

    static List<String> keysIn(Channel channel, String queue) throws Exception {
        List<String> keys = new ArrayList<>();
        for (GetResponse r : drain(channel, queue)) {
            keys.add(r.getEnvelope().getRoutingKey());
        }
        Collections.sort(keys);
        return keys;
    }

    static void mandatoryReturn(Connection connection) throws Exception {
        Channel channel = connection.createChannel();
        channel.confirmSelect();
        String exchange = unique("direct");
        channel.exchangeDeclare(exchange, "direct", false, true, null);
        String queue = exclusiveQueue(channel, "routed");
        channel.queueBind(queue, exchange, "routed");

        // Both listeners run on the connection's reader thread, in frame order.
        List<String> events = new CopyOnWriteArrayList<>();
        List<Return> returns = new CopyOnWriteArrayList<>();
        channel.addReturnListener(r -> {
            returns.add(r);
            events.add("return");
        });
        channel.addConfirmListener((tag, multiple) -> events.add("ack"), (tag, multiple) -> events.add("nack"));

        AMQP.BasicProperties props = new AMQP.BasicProperties.Builder().messageId("unroutable").build();
        channel.basicPublish(exchange, "nowhere", true, props, utf8("lost"));
        channel.waitForConfirmsOrDie(WAIT_MS);
        checkEqual(events, List.of("return", "ack"), "events for the unroutable message (return before ack)");
        Return r = returns.get(0);
        checkEqual(r.getReplyCode(), 312, "reply code");
        checkEqual(r.getReplyText(), "NO_ROUTE", "reply text");
        checkEqual(r.getExchange(), exchange, "exchange of the return");
        checkEqual(r.getRoutingKey(), "nowhere", "routing key of the return");
        checkEqual(text(r.getBody()), "lost", "body of the return");
        checkEqual(r.getProperties().getMessageId(), "unroutable", "message id of the return");

        // A routable mandatory message is delivered, not returned.
        channel.basicPublish(exchange, "routed", true, null, utf8("kept"));
        channel.waitForConfirmsOrDie(WAIT_MS);
        checkEqual(returns.size(), 1, "returns after a routable mandatory publish");
        List<String> kept = new ArrayList<>();
        for (GetResponse g : drain(channel, queue)) {
            kept.add(text(g.getBody()));
        }
        checkEqual(kept, List.of("kept"), "messages in the bound queue");
        channel.exchangeDelete(exchange);
        channel.close();
    }
}
