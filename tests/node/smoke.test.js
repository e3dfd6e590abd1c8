// Smoke test: the amqplib Node client against the broker at BERTH_TEST_URI.
//
// Pins what a Node application relies on: publisher confirms, manual acks,
// topic routing with `*` and `#`, and mandatory publishes coming back as
// basic.return 312 NO_ROUTE. Every name is unique so the test can share a
// broker with others; every wait is bounded.
'use strict';

const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const amqp = require('amqplib');

const URI = process.env.BERTH_TEST_URI;
const WAIT_MS = 10_000; // longest any single expected event may take
const TEST_MS = 30_000; // longest any one test may take

const unique = (what) => `smoke.node.${what}.${crypto.randomUUID()}`;

// Resolves like `promise`, or rejects naming `what` after `ms`.
function within(promise, what, ms = WAIT_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// Drains `queue` with basic.get and returns the messages in order.
async function drain(channel, queue) {
  const messages = [];
  for (;;) {
    const message = await within(channel.get(queue, { noAck: true }), `basic.get on ${queue}`);
    if (message === false) return messages;
    messages.push(message);
  }
}

describe('amqplib smoke', { timeout: 4 * TEST_MS }, () => {
  let connection;

  before(async () => {
    assert.ok(URI, 'BERTH_TEST_URI must be set (tests/node/run.sh sets it)');
    // `timeout` bounds the TCP connect and the AMQP handshake.
    connection = await within(amqp.connect(URI, { timeout: WAIT_MS }), `connection to ${URI}`);
    // A connection error must fail the run, not crash it later.
    connection.on('error', (err) => console.error('connection error:', err.message));
  });

  after(async () => {
    if (!connection) return;
    try {
      await within(connection.close(), 'connection.close');
    } catch (err) {
      // An open socket would keep this process (and the run) alive.
      connection.connection.stream.destroy();
      throw err;
    }
  });

  it('publisher confirms ack every published message', { timeout: TEST_MS }, async () => {
    const channel = await connection.createConfirmChannel();
    const { queue } = await channel.assertQueue(unique('confirms'), { exclusive: true });
    const count = 50;
    const acked = [];
    for (let i = 0; i < count; i++) {
      acked.push(
        new Promise((resolve, reject) => {
          channel.publish('', queue, Buffer.from(`m${i}`), { persistent: true }, (err) =>
            err ? reject(new Error(`message ${i} was nacked`)) : resolve(i),
          );
        }),
      );
    }
    assert.deepEqual(await within(Promise.all(acked), `${count} publisher confirms`), [...Array(count).keys()]);
    await within(channel.waitForConfirms(), 'waitForConfirms');
    const { messageCount } = await channel.checkQueue(queue);
    assert.equal(messageCount, count, 'every confirmed message is in the queue');
    await channel.close();
  });

  it('a consumer with manual acks receives every message once, and acks remove them', { timeout: TEST_MS }, async () => {
    const publisher = await connection.createConfirmChannel();
    const { queue } = await publisher.assertQueue(unique('acks'), { exclusive: true });
    const count = 30;
    for (let i = 0; i < count; i++) {
      publisher.publish('', queue, Buffer.from(`body-${i}`), {
        contentType: 'text/plain',
        headers: { 'x-index': i },
      });
    }
    await within(publisher.waitForConfirms(), 'publisher confirms');

    const consumer = await connection.createChannel();
    await consumer.prefetch(10);
    const received = [];
    let allReceived;
    let cancelled;
    const done = new Promise((resolve, reject) => {
      allReceived = resolve;
      cancelled = reject;
    });
    const { consumerTag } = await consumer.consume(
      queue,
      (message) => {
        if (message === null) return cancelled(new Error('the broker cancelled the consumer'));
        received.push(message);
        consumer.ack(message);
        if (received.length === count) allReceived();
      },
      { noAck: false },
    );
    await within(done, `${count} deliveries`);
    await consumer.cancel(consumerTag);

    assert.deepEqual(
      received.map((m) => m.content.toString()),
      [...Array(count).keys()].map((i) => `body-${i}`),
      'all messages arrive, in publish order',
    );
    for (const [i, m] of received.entries()) {
      assert.equal(m.fields.redelivered, false);
      assert.equal(m.fields.routingKey, queue);
      assert.equal(m.properties.contentType, 'text/plain');
      assert.equal(m.properties.headers['x-index'], i);
    }
    const tags = received.map((m) => m.fields.deliveryTag);
    assert.deepEqual(tags, [...Array(count).keys()].map((i) => i + 1), 'delivery tags count up from 1');

    // Had any ack been lost, closing the channel would requeue that message.
    await consumer.close();
    const { messageCount, consumerCount } = await publisher.checkQueue(queue);
    assert.equal(messageCount, 0, 'acked messages are gone from the queue');
    assert.equal(consumerCount, 0);
    await publisher.close();
  });

  it('topic exchange routes by * and # and drops non-matching keys', { timeout: TEST_MS }, async () => {
    const channel = await connection.createConfirmChannel();
    const exchange = unique('topic');
    await channel.assertExchange(exchange, 'topic', { durable: false, autoDelete: true });
    const star = (await channel.assertQueue(unique('star'), { exclusive: true })).queue;
    const hash = (await channel.assertQueue(unique('hash'), { exclusive: true })).queue;
    const tail = (await channel.assertQueue(unique('tail'), { exclusive: true })).queue;
    await channel.bindQueue(star, exchange, 'stock.*.nyse');
    await channel.bindQueue(hash, exchange, 'stock.#');
    await channel.bindQueue(tail, exchange, '#.error');

    const keys = ['stock.ibm.nyse', 'stock.ibm.x.nyse', 'stock', 'stock.nyse', 'app.db.error', 'error', 'bond.ibm.nyse', 'stockx.ibm.nyse'];
    for (const key of keys) channel.publish(exchange, key, Buffer.from(key));
    await within(channel.waitForConfirms(), 'publisher confirms');

    const keysIn = async (queue) => (await drain(channel, queue)).map((m) => m.fields.routingKey).sort();
    assert.deepEqual(await keysIn(star), ['stock.ibm.nyse'], '* matches exactly one word');
    assert.deepEqual(
      await keysIn(hash),
      ['stock', 'stock.ibm.nyse', 'stock.ibm.x.nyse', 'stock.nyse'],
      '# matches zero or more words',
    );
    assert.deepEqual(await keysIn(tail), ['app.db.error', 'error'], 'leading # matches zero or more words');

    await channel.deleteExchange(exchange);
    await channel.close();
  });

  it('mandatory publish to an unroutable key comes back as basic.return 312 NO_ROUTE', { timeout: TEST_MS }, async () => {
    const channel = await connection.createConfirmChannel();
    const exchange = unique('direct');
    await channel.assertExchange(exchange, 'direct', { durable: false, autoDelete: true });
    const { queue } = await channel.assertQueue(unique('routed'), { exclusive: true });
    await channel.bindQueue(queue, exchange, 'routed');

    const returns = [];
    channel.on('return', (message) => returns.push(message));
    let returnedBeforeAck;
    const confirmed = new Promise((resolve, reject) => {
      channel.publish(exchange, 'nowhere', Buffer.from('lost'), { mandatory: true, messageId: 'unroutable' }, (err) => {
        returnedBeforeAck = returns.length;
        err ? reject(new Error('unroutable message was nacked, expected ack')) : resolve();
      });
    });
    await within(confirmed, 'confirm of the unroutable message');
    assert.equal(returnedBeforeAck, 1, 'basic.return arrives before the basic.ack of the same message');
    const [returned] = returns;
    assert.equal(returned.fields.replyCode, 312);
    assert.equal(returned.fields.replyText, 'NO_ROUTE');
    assert.equal(returned.fields.exchange, exchange);
    assert.equal(returned.fields.routingKey, 'nowhere');
    assert.equal(returned.content.toString(), 'lost');
    assert.equal(returned.properties.messageId, 'unroutable');

    // A routable mandatory message is delivered, not returned.
    channel.publish(exchange, 'routed', Buffer.from('kept'), { mandatory: true });
    await within(channel.waitForConfirms(), 'confirm of the routable message');
    assert.equal(returns.length, 1, 'a routable mandatory message is not returned');
    const kept = await drain(channel, queue);
    assert.deepEqual(kept.map((m) => m.content.toString()), ['kept']);

    await channel.deleteExchange(exchange);
    await channel.close();
  });
});
