// Interop test: ordinary amqplib programs that work against RabbitMQ 3.10
// must work against the broker at BERTH_TEST_URI too (issue 11).
//
// Each test is a small program as a new user would write it; each assertion
// was first checked against a private RabbitMQ 3.10.8 through
// BERTH_TEST_URI. Every name is unique; every wait is bounded.
'use strict';

const { describe, it } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const amqp = require('amqplib');

const URI = process.env.BERTH_TEST_URI;
const WAIT_MS = 10_000; // longest any single expected event may take
const TEST_MS = 30_000; // longest any one test may take

const unique = (what) => `interop.node.${what}.${crypto.randomUUID()}`;

// Resolves like `promise`, or rejects naming `what` after `ms`.
function within(promise, what, ms = WAIT_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// A connection whose 'error' and 'close' events are recorded, not thrown.
async function connect() {
  assert.ok(URI, 'BERTH_TEST_URI must be set (tests/node/run.sh sets it)');
  const connection = await within(amqp.connect(URI, { timeout: WAIT_MS }), `connection to ${URI}`);
  connection.errors = [];
  connection.on('error', (err) => connection.errors.push(err));
  connection.closed = new Promise((resolve) => connection.once('close', resolve));
  return connection;
}

// Ends a connection the test is done with, even a broken one, so no socket
// keeps the run alive.
async function dispose(connection) {
  try {
    await within(connection.close(), 'connection.close', 2_000);
  } catch {
    connection.connection.stream.destroy();
  }
}

describe('amqplib programs that work against RabbitMQ', { timeout: 6 * TEST_MS }, () => {
  // amqplib writes connection.close straight to the socket, but a channel's
  // frames through a per-channel buffer: with messages still buffered, the
  // broker reads connection.close while frames of the publishing channel
  // are still on their way. RabbitMQ answers close-ok and then reads (and
  // drops) whatever else the client writes until the client closes the
  // socket; closing at once makes those writes fail with EPIPE/ECONNRESET,
  // and the close promise never settles.
  it('connection.close while a channel is still publishing resolves, with no socket error', { timeout: TEST_MS }, async () => {
    const rounds = 5;
    const messages = 2_000;
    for (let round = 0; round < rounds; round++) {
      const connection = await connect();
      try {
        const channel = await connection.createChannel();
        const { queue } = await channel.assertQueue(unique('close-while-publishing'), { exclusive: true });
        for (let i = 0; i < messages; i++) {
          // The return value is only back-pressure advice: every message is
          // buffered in the client, as a program that ignores it would do.
          channel.sendToQueue(queue, Buffer.from(`message ${i} of round ${round}`));
        }
        await within(connection.close(), `connection.close with ${messages} publishes buffered (round ${round})`);
        const closeError = await within(connection.closed, `the 'close' event (round ${round})`);
        assert.equal(closeError, undefined, `'close' carries no error (round ${round})`);
        assert.deepEqual(
          connection.errors.map((e) => e.message),
          [],
          `no connection error (round ${round})`,
        );
      } catch (err) {
        connection.connection.stream.destroy();
        throw err;
      }
    }
  });

  // On the deleting channel RabbitMQ sends queue.delete-ok first, then
  // basic.cancel (on another channel the two race). The order matters to
  // a program that closes its channel when its consumer is cancelled, a
  // common clean-up: after basic.cancel amqplib's closing channel ignores
  // every frame but channel.close-ok, so a delete-ok that comes second is
  // dropped and deleteQueue is rejected with "Channel ended, no reply will
  // be forthcoming".
  for (const [name, options] of [
    ['plain', { durable: false }],
    ['exclusive', { exclusive: true }],
    ['auto-delete', { autoDelete: true }],
  ]) {
    for (const from of ['its own channel', 'another channel']) {
      it(`deleting a consumed ${name} queue from ${from}: deleteQueue resolves and the consumer gets null`, { timeout: TEST_MS }, async () => {
        const connection = await connect();
        try {
          const channel = await connection.createChannel();
          const deleter = from === 'its own channel' ? channel : await connection.createChannel();
          const channelErrors = [];
          channel.on('error', (err) => channelErrors.push(err));
          deleter.on('error', (err) => channelErrors.push(err));
          const { queue } = await channel.assertQueue(unique(`delete-consumed-${name}`), options);
          const deliveries = [];
          let cancelled;
          const cancellation = new Promise((resolve) => {
            cancelled = resolve;
          });
          await channel.consume(queue, (message) => {
            if (message !== null) return deliveries.push(message);
            // Cancelled by the broker: this consumer's channel is done.
            cancelled(channel.close());
          });

          const deleteOk = await within(deleter.deleteQueue(queue), 'queue.delete-ok');
          assert.equal(deleteOk.messageCount, 0);
          const closing = await within(cancellation, 'the consumer callback called with null (basic.cancel)');
          await within(closing, 'channel.close of the cancelled consumer');
          assert.equal(deliveries.length, 0);
          if (deleter !== channel) {
            // The deleting channel is untouched.
            const { queue: other } = await within(deleter.assertQueue('', { exclusive: true }), 'queue.declare after the delete');
            assert.match(other, /^amq\.gen-/);
            await within(deleter.close(), 'channel.close of the deleting channel');
          }
          assert.deepEqual(channelErrors.map((e) => e.message), [], 'no channel error');
          await within(connection.close(), 'connection.close');
          assert.deepEqual(connection.errors.map((e) => e.message), [], 'no connection error');
        } catch (err) {
          await dispose(connection);
          throw err;
        }
      });
    }
  }
});
