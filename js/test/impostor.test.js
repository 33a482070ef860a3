// A client never sends a byte to a service that is not its own user's,
// holding this store: the socket and its folder are checked before it
// connects, and the first message, `hello` with a random nonce, must be
// answered with the proof of service.json's secret by the process the file
// names. Against stand-ins that fail each check in turn, and the real
// service that passes them.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { connect, findService, storeLayout, E_RESOURCE_SERVICE, ANSWER_TIMEOUT_MS, HELLO_TIMEOUT_MS, MAX_LINE_FROM_SERVICE } from '../index.js';
import { FakeService, Fixture, helloProof, waitFor, within } from './fixture.js';

const NONCE = /^[0-9a-f]{64}$/;
const NOT_PROVED = /did not prove that it holds the store's secret \(service\.json\): not the store's service; nothing else was sent/;

/** The error `promise` rejects with (failing if it resolves). */
function rejection(promise, what) {
  return within(10_000, promise, what).then(
    (value) => {
      if (value && typeof value.close === 'function') value.close();
      assert.fail(`${what} resolved`);
    },
    (e) => e,
  );
}

/** Asserts that `conn` got exactly one line, `hello` with a nonce, and was closed by the client; the nonce. */
async function helloAlone(conn, what) {
  await waitFor(`the client to close its connection (${what})`, () => conn.closed, { timeout: 5000 });
  assert.equal(conn.lines.length, 1, `${what}: the client sent ${JSON.stringify(conn.lines)}`);
  const [request] = conn.requests;
  assert.equal(request.method, 'hello', `${what}: ${conn.lines[0]}`);
  assert.match(request.params?.nonce ?? '', NONCE, `${what}: ${conn.lines[0]}`);
  return request.params.nonce;
}

test('a service that does not prove the secret of service.json gets hello alone, and connect refuses it', { timeout: 60_000 }, async (t) => {
  let wrong;
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? wrong(req) : {}));
  fake.writeServiceFile();
  const other = crypto.randomBytes(32).toString('hex');
  const cases = {
    'no proof': (req) => ({ ...fake.hello(req), proof: undefined }),
    'a random proof': (req) => ({ ...fake.hello(req), proof: crypto.randomBytes(32).toString('hex') }),
    'the proof of another secret': (req) => ({ ...fake.hello(req), proof: helloProof(other, req.params.nonce) }),
    'the proof of another nonce': (req) => ({ ...fake.hello(req), proof: helloProof(fake.secret, 'an earlier nonce') }),
    'the proof keyed with the secret decoded from hex': (req) => ({
      ...fake.hello(req),
      proof: crypto.createHmac('sha256', Buffer.from(fake.secret, 'hex')).update(`gem-resources hello\n${req.params.nonce}`).digest('hex'),
    }),
    'a proof that is not hex': () => ({ ...fake.hello({}), proof: 'z'.repeat(64) }),
    'a proof cut short': (req) => ({ ...fake.hello(req), proof: fake.hello(req).proof.slice(0, 62) }),
    'a proof too long': (req) => ({ ...fake.hello(req), proof: fake.hello(req).proof + '00' }),
    'a proof that is a number': () => ({ ...fake.hello({}), proof: 42 }),
    'a null answer': () => null,
    'an error answer': () => ({ error: { code: -32602, message: 'params.nonce: unknown field' } }),
  };
  const nonces = new Set();
  for (const [what, answer] of Object.entries(cases)) {
    wrong = answer;
    const before = fake.connections.length;
    const error = await rejection(connect({ store: fake.store }), `connect to a service answering ${what}`);
    assert.equal(error.code, E_RESOURCE_SERVICE, `${what}: ${error.message}`);
    assert.match(error.message, NOT_PROVED, what);
    assert.ok(error.message.includes(fake.store), error.message);
    assert.equal(fake.connections.length, before + 1, `${what}: ${fake.connections.length - before} connections`);
    nonces.add(await helloAlone(fake.connections.at(-1), what));
  }
  assert.equal(nonces.size, Object.keys(cases).length, 'a nonce was used twice');
});

test('a service that accepts and never answers hello is given up after the hello timeout', { timeout: 30_000 }, async (t) => {
  const fake = await FakeService.start(t, () => undefined);
  fake.writeServiceFile();
  const started = Date.now();
  const error = await within(HELLO_TIMEOUT_MS + 5000, connect({ store: fake.store }).then(
    (client) => {
      client.close();
      assert.fail('connect resolved');
    },
    (e) => e,
  ), 'connect to a mute service');
  const waited = Date.now() - started;
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, /did not answer hello within 5 s/);
  assert.ok(waited >= HELLO_TIMEOUT_MS - 100, `gave up after ${waited} ms`);
  await helloAlone(fake.connections[0], 'a mute service');
});

test('the proof of the secret from another process than service.json names is refused', { timeout: 30_000 }, async (t) => {
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? { ...fake.hello(req), pid: fake.pid + 1 } : {}));
  fake.writeServiceFile();
  const error = await rejection(connect({ store: fake.store }), 'connect to another process');
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, new RegExp(`is process ${fake.pid + 1}, not the service ${fake.pid} that service\\.json names`));
  await helloAlone(fake.connections[0], 'another process');
});

test('a service that proves the secret is accepted, and each subscription connection proves it again', { timeout: 30_000 }, async (t) => {
  let impostor = false;
  const fake = await FakeService.start(t, (req, conn) => {
    if (req.method === 'hello') {
      const hello = fake.hello(req);
      return impostor ? { ...hello, proof: helloProof(crypto.randomBytes(32).toString('hex'), req.params.nonce) } : hello;
    }
    if (req.method === 'subscribe') return { subscription: fake.connections.indexOf(conn), status: [] };
    return { echo: req.method };
  });
  fake.writeServiceFile();
  const client = await connect({ store: fake.store });
  t.after(() => client.close());
  const [first] = fake.connections;
  const nonce = first.requests[0].params.nonce;
  assert.match(nonce, NONCE);
  assert.equal(client.service.proof, helloProof(fake.secret, nonce));
  assert.equal(client.service.pid, fake.pid);
  assert.deepEqual(await client.status(), { echo: 'status' });

  // A subscription: its own connection, `hello` with a nonce of its own first, then `subscribe`.
  const sub = await client.subscribe({ gem: 'notes' });
  assert.equal(fake.connections.length, 2);
  const second = fake.connections[1];
  assert.deepEqual(second.requests.map((r) => r.method), ['hello', 'subscribe']);
  assert.match(second.requests[0].params.nonce, NONCE);
  assert.notEqual(second.requests[0].params.nonce, nonce);
  sub.close();

  // Another process has taken the socket's place since: the subscription's
  // connection gets `hello` alone, and the client's own goes on.
  impostor = true;
  const error = await rejection(client.subscribe({ gem: 'notes' }), 'a subscription to a service that no longer proves the secret');
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, NOT_PROVED);
  assert.equal(fake.connections.length, 3);
  await helloAlone(fake.connections[2], 'the subscription connection');
  assert.deepEqual(await client.status(), { echo: 'status' });
});

test('findService hands out service.json without its secret; a file with no secret (an earlier service) is refused before connecting', { timeout: 30_000 }, async (t) => {
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? fake.hello(req) : {}));
  const written = fake.writeServiceFile();
  const { secret, ...shown } = written;
  assert.match(secret, NONCE);
  assert.deepEqual(await findService(fake.store), shown);

  for (const missing of [{ secret: undefined }, { secret: '' }]) {
    fake.writeServiceFile(missing);
    const error = await rejection(connect({ store: fake.store }), `connect with secret ${JSON.stringify(missing.secret)}`);
    assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
    assert.match(error.message, /holds no secret/);
    assert.match(error.message, /restart the service/);
  }
  assert.equal(fake.connections.length, 0, 'the client connected to a service it could not check');
});

test('a socket whose folder is open to others, or that is not a socket, is refused before the client connects', { timeout: 30_000 }, async (t) => {
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? fake.hello(req) : {}));
  fake.writeServiceFile();

  fs.chmodSync(fake.run, 0o755);
  for (const options of [{ store: fake.store }, { socket: fake.socket }]) {
    const error = await rejection(connect(options), `connect(${JSON.stringify(options)}) through a folder open to others`);
    assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
    assert.match(error.message, /the socket's folder .* is open to other users \(mode 0755; it must be 0700\): refusing to connect/);
    assert.ok(error.message.includes(fake.run), error.message);
  }
  assert.equal(fake.connections.length, 0, 'the client connected through a folder open to others');

  // A link to the socket, and a file in its place, in a folder that is the user's own.
  fs.chmodSync(fake.run, 0o700);
  const link = path.join(fake.run, 'link.sock');
  fs.symlinkSync(fake.socket, link);
  const file = path.join(fake.run, 'file.sock');
  fs.writeFileSync(file, '');
  for (const [socket, kind] of [[link, 'a symbolic link'], [file, 'a regular file']]) {
    fake.writeServiceFile({ socket });
    const error = await rejection(connect({ store: fake.store }), `connect to ${kind}`);
    assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
    assert.ok(error.message.includes(`${socket} is not a socket (${kind})`), error.message);
  }
  assert.equal(fake.connections.length, 0, 'the client connected through a link or a file');

  // The same socket in its own closed folder: accepted (the checks are not "always refuse").
  fake.writeServiceFile();
  const client = await connect({ store: fake.store });
  client.close();
  assert.equal(fake.connections.length, 1);
});

test('a socket, or its folder, of another user is refused before the client connects', { timeout: 30_000 }, async (t) => {
  if (process.platform === 'win32' || typeof process.getuid !== 'function' || process.getuid() !== 0) {
    t.skip('needs root');
    return;
  }
  const OTHER = 65534;
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? fake.hello(req) : {}));
  fake.writeServiceFile();
  try {
    fs.lchownSync(fake.socket, OTHER, OTHER);
    const socketError = await rejection(connect({ store: fake.store }), 'connect to a socket of another user');
    assert.equal(socketError.code, E_RESOURCE_SERVICE, socketError.message);
    assert.ok(
      socketError.message.includes(`the socket ${fake.socket} belongs to user ${OTHER}, not to this user (0): refusing to connect`),
      socketError.message,
    );
    fs.lchownSync(fake.socket, 0, 0);
    fs.chownSync(fake.run, OTHER, OTHER);
    const folderError = await rejection(connect({ socket: fake.socket }), 'connect through a folder of another user');
    assert.equal(folderError.code, E_RESOURCE_SERVICE, folderError.message);
    assert.ok(
      folderError.message.includes(`the socket's folder ${fake.run} belongs to user ${OTHER}, not to this user (0): refusing to connect`),
      folderError.message,
    );
  } finally {
    fs.lchownSync(fake.socket, 0, 0);
    fs.chownSync(fake.run, 0, 0);
  }
  assert.equal(fake.connections.length, 0, 'the client connected to a socket of another user');
});

test('the real service proves its secret: connect through the store, and a subscription on it', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const file = path.join(storeLayout(ctx.store), 'service.json');
  assert.equal(fs.statSync(file).mode & 0o777, 0o600, 'service.json is not 0600');
  const { secret, ...shown } = JSON.parse(fs.readFileSync(file, 'utf8'));
  assert.match(secret, NONCE, 'service.json holds no secret of 64 hex digits');
  assert.deepEqual(await findService(ctx.store), shown);

  // The service's proof is the one this test computes.
  const peer = await ctx.raw();
  await peer.send({ jsonrpc: '2.0', id: 1, method: 'hello', params: { nonce: 'a nonce of the test' } });
  const answer = await peer.waitFor((m) => m.id === 1);
  assert.equal(answer.result.proof, helloProof(secret, 'a nonce of the test'));

  const client = await ctx.connect();
  assert.match(client.service.proof, NONCE);
  assert.equal(client.service.pid, ctx.service.pid);
  const sub = await client.subscribe();
  t.after(() => sub.close());
  const origin = ctx.origin.add('a.bin', { size: 1024 });
  await ctx.installGem('notes', [ctx.resource(origin, { id: 'a' })], client);
  const installed = await within(10_000, (async () => {
    for await (const event of sub) if (event.event === 'installed') return event;
  })(), 'the installed event');
  assert.equal(installed.gem, 'notes');
});

test('a service that sends a line without end fails the pending call once the line passes the bound', { timeout: 60_000 }, async (t) => {
  let sent = 0;
  const piece = 'x'.repeat(1024 * 1024);
  const fake = await FakeService.start(t, (req, conn) => {
    if (req.method === 'hello') return fake.hello(req);
    // A line that never ends: pieces for as long as the client reads (up to four times the bound).
    const pump = () => {
      while (!conn.socket.destroyed && sent < 4 * MAX_LINE_FROM_SERVICE) {
        sent += piece.length;
        if (!conn.socket.write(piece)) return void conn.socket.once('drain', pump);
      }
    };
    conn.socket.write('{"jsonrpc":"2.0","id":' + req.id + ',"result":"');
    pump();
    return undefined;
  });
  fake.writeServiceFile();
  const client = await connect({ store: fake.store });
  t.after(() => client.close());
  const error = await rejection(client.status(), 'status answered with a line without end');
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, new RegExp(`sent a line longer than ${MAX_LINE_FROM_SERVICE} bytes`));
  await waitFor('the client to close the connection', () => fake.connections[0].closed, { timeout: 10_000 });
  assert.ok(sent < 2 * MAX_LINE_FROM_SERVICE, `the client read ${sent} characters of one line`);
  const later = await client.status().catch((e) => e);
  assert.equal(later.code, E_RESOURCE_SERVICE);
  t.diagnostic(`the service had written ${sent} characters when the client closed the connection`);
});

test('a call the service never answers rejects after the answer timeout; a path waits as long as it must', { timeout: 30_000 }, async (t) => {
  // A service that proves itself, then answers nothing.
  const fake = await FakeService.start(t, (req) => (req.method === 'hello' ? fake.hello(req) : undefined));
  fake.writeServiceFile();
  const client = await connect({ store: fake.store, answerTimeoutMs: 300 });
  t.after(() => client.close());
  let pathSettled = false;
  client.path('g', 'r').then(
    () => (pathSettled = true),
    () => (pathSettled = true),
  );
  const started = Date.now();
  const error = await rejection(client.status(), 'status of a mute service');
  const waited = Date.now() - started;
  assert.equal(error.code, E_RESOURCE_SERVICE, error.message);
  assert.match(error.message, /did not answer `status` within 0\.3 s/);
  assert.ok(waited >= 250 && waited < 5000, `gave up after ${waited} ms`);
  await new Promise((resolve) => setTimeout(resolve, 400));
  assert.equal(pathSettled, false, 'path waits for its transfer, with no answer timeout');
  assert.equal(ANSWER_TIMEOUT_MS, 30_000);
});
