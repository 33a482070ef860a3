// The client's framing against a small in-test JSON-RPC server over a Unix
// socket (no gem-resources needed): ids, answers out of order, lines split
// anywhere, errors, notifications, lagged, closed connections, discovery.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { connect, findService, ResourceError, storeLayout, E_RESOURCE_LAGGED, E_RESOURCE_SERVICE } from '../index.js';
import { helloProof } from './fixture.js';

/**
 * A mock service on `<store>/store-v1/run/api.sock`. `handler(request, conn)`
 * answers: a value is sent as the result, `{error}` as an error, `undefined`
 * sends nothing (the test answers by hand through `conn.send`).
 */
async function mockService(t, handler) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gr-js-mock-'));
  const store = path.join(dir, 'store');
  const run = path.join(storeLayout(store), 'run');
  fs.mkdirSync(run, { recursive: true, mode: 0o700 });
  const socketPath = path.join(run, 'api.sock');
  const secret = crypto.randomBytes(32).toString('hex');
  const received = [];
  const connections = [];
  const server = net.createServer((socket) => {
    const conn = {
      socket,
      lines: [],
      send: (obj) => socket.write((typeof obj === 'string' ? obj : JSON.stringify(obj)) + '\n'),
      answer: (id, result) => conn.send({ jsonrpc: '2.0', id, result }),
    };
    connections.push(conn);
    let buffer = '';
    socket.setEncoding('utf8');
    socket.on('error', () => {});
    socket.on('data', async (chunk) => {
      buffer += chunk;
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        conn.lines.push(line);
        const request = JSON.parse(line);
        received.push(request);
        if (request.method === 'hello') {
          const hello = { protocol: 1, version: '0.0.0-mock', store, pid: process.pid };
          if (request.params?.nonce !== undefined) hello.proof = helloProof(secret, request.params.nonce);
          conn.answer(request.id, hello);
          continue;
        }
        const out = await handler(request, conn);
        if (out === undefined) continue;
        if (out && out.error) conn.send({ jsonrpc: '2.0', id: request.id, error: out.error });
        else conn.answer(request.id, out);
      }
    });
  });
  await new Promise((resolve) => server.listen(socketPath, resolve));
  fs.writeFileSync(
    path.join(storeLayout(store), 'service.json'),
    JSON.stringify({ protocol: 1, socket: socketPath, pid: process.pid, version: '0.0.0-mock', secret }),
    { mode: 0o600 },
  );
  const mock = { dir, store, socketPath, received, connections, server };
  t.after(async () => {
    for (const c of connections) c.socket.destroy();
    await new Promise((resolve) => server.close(resolve));
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return mock;
}

test('requests are one JSON line each, with increasing ids, and each method sends the params of PROTOCOL.md', async (t) => {
  const mock = await mockService(t, (req) => ({ echo: req.method }));
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const manifest = { resources: [] };
  await client.status();
  await client.status('notes');
  await client.path('notes', 'ocr');
  await client.install('notes', manifest);
  await client.uninstall('notes');
  await client.downloadNow('notes', 'ocr');
  await client.cancel('notes', 'ocr');
  await client.retry('notes', 'ocr');
  await client.autofill('https://cdn.test/a');
  await client.autofillManifest(manifest, { all: true });
  await client.autofillManifest(manifest);
  await client.policy();
  await client.setPolicy({ mode: 'blocklist', hosts: ['cdn.test'] });
  const lines = mock.connections[0].lines;
  const sent = lines.map((l) => JSON.parse(l));
  for (const line of lines) assert.ok(!line.includes('\n'));
  assert.deepEqual(
    sent.map((m) => m.id),
    sent.map((_, i) => i + 1),
  );
  for (const m of sent) assert.equal(m.jsonrpc, '2.0');
  // The first, `hello`, carries the nonce the service proves its secret with.
  assert.match(sent[0].params?.nonce ?? '', /^[0-9a-f]{64}$/);
  delete sent[0].params;
  assert.deepEqual(
    sent.map(({ method, params }) => ({ method, params })),
    [
      { method: 'hello', params: undefined },
      { method: 'status', params: undefined },
      { method: 'status', params: { gem: 'notes' } },
      { method: 'path', params: { gem: 'notes', id: 'ocr' } },
      { method: 'install', params: { gem: 'notes', manifest } },
      { method: 'uninstall', params: { gem: 'notes' } },
      { method: 'download_now', params: { gem: 'notes', id: 'ocr' } },
      { method: 'cancel', params: { gem: 'notes', id: 'ocr' } },
      { method: 'retry', params: { gem: 'notes', id: 'ocr' } },
      { method: 'autofill', params: { url: 'https://cdn.test/a' } },
      { method: 'autofill', params: { manifest, all: true } },
      { method: 'autofill', params: { manifest } },
      { method: 'policy', params: undefined },
      { method: 'set_policy', params: { mode: 'blocklist', hosts: ['cdn.test'] } },
    ],
  );
});

test('answers are matched by id whatever their order, and a line may come in any pieces', async (t) => {
  const held = [];
  const mock = await mockService(t, (req, conn) => {
    held.push(req);
    if (held.length < 3) return undefined;
    // Answer the three in reverse order, as one write cut at odd places,
    // with a multi-byte character split between two writes.
    const text = held
      .slice()
      .reverse()
      .map((r) => JSON.stringify({ jsonrpc: '2.0', id: r.id, result: { gem: r.params.gem, resource: r.params.id, path: `/p/${r.params.id}/é` } }) + '\n')
      .join('');
    const bytes = Buffer.from(text, 'utf8');
    const cut = bytes.indexOf(Buffer.from('é')) + 1; // inside the two bytes of é
    conn.socket.write(bytes.subarray(0, 7));
    setTimeout(() => conn.socket.write(bytes.subarray(7, cut)), 10);
    setTimeout(() => conn.socket.write(bytes.subarray(cut)), 20);
    return undefined;
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const gem = client.forGem('notes');
  const paths = await Promise.all([gem.path('a'), gem.path('b'), gem.path('c')]);
  assert.deepEqual(paths, ['/p/a/é', '/p/b/é', '/p/c/é']);
});

test('an error answer becomes a ResourceError with the code, the primary cause, the attempts and the data', async (t) => {
  const data = {
    code: 'E_RESOURCE_UNAVAILABLE',
    primary_cause: 'E_RESOURCE_POLICY',
    message: 'resource "ocr": every address failed\n  - E_RESOURCE_POLICY: https://cdn.test/ocr.onnx: not permitted',
    resource: 'ocr',
    attempts: [{ address: 'https://cdn.test/ocr.onnx', hop: null, code: 'E_RESOURCE_POLICY', reason: 'not permitted' }],
  };
  const mock = await mockService(t, (req) => {
    if (req.method === 'path') return { error: { code: -32000, message: data.message, data } };
    return { error: { code: -32601, message: 'unknown method' } };
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const error = await client.path('notes', 'ocr').then(
    () => assert.fail('resolved'),
    (e) => e,
  );
  assert.ok(error instanceof ResourceError);
  assert.ok(error instanceof Error);
  assert.equal(error.code, 'E_RESOURCE_UNAVAILABLE');
  assert.equal(error.primaryCause, 'E_RESOURCE_POLICY');
  assert.deepEqual(error.attempts, data.attempts);
  assert.deepEqual(error.data, data);
  assert.equal(error.rpcCode, -32000);
  assert.equal(error.message, data.message);
  const other = await client.request('nonsense').catch((e) => e);
  assert.equal(other.rpcCode, -32601);
  assert.equal(other.code, E_RESOURCE_SERVICE);
  assert.equal(other.message, 'unknown method');
  // The connection goes on after errors.
  assert.equal((await client.hello()).protocol, 1);
});

test('a connection closed while requests are pending rejects each of them with E_RESOURCE_SERVICE', async (t) => {
  const mock = await mockService(t, (req, conn) => {
    if (req.method === 'path') setTimeout(() => conn.socket.destroy(), 20);
    return undefined;
  });
  const client = await connect({ store: mock.store });
  const results = await Promise.allSettled([client.status(), client.path('notes', 'ocr')]);
  for (const r of results) {
    assert.equal(r.status, 'rejected');
    assert.ok(r.reason instanceof ResourceError);
    assert.equal(r.reason.code, E_RESOURCE_SERVICE);
    assert.match(r.reason.message, /closed/);
  }
  // And any later request at once.
  const later = await client.hello().catch((e) => e);
  assert.equal(later.code, E_RESOURCE_SERVICE);
});

test('subscribe: the starting status, then events in order, and close() sends unsubscribe and ends the iteration', async (t) => {
  const status = [{ gem: 'notes', resources: [{ id: 'ocr', state: 'missing' }] }];
  let subConn;
  const mock = await mockService(t, (req, conn) => {
    if (req.method === 'subscribe') {
      subConn = conn;
      conn.answer(req.id, { subscription: 7, status });
      for (let i = 0; i < 5; i++) {
        conn.send({ jsonrpc: '2.0', method: 'event', params: { event: 'progress', gem: req.params.gem, resource: 'ocr', bytes: i } });
      }
      return undefined;
    }
    if (req.method === 'unsubscribe') return {};
    return {};
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const sub = await client.forGem('notes').subscribe();
  assert.deepEqual(sub.status, status);
  assert.equal(sub.id, 7);
  const seen = [];
  for await (const event of sub) {
    seen.push(event.bytes);
    if (seen.length === 5) sub.close();
  }
  assert.deepEqual(seen, [0, 1, 2, 3, 4]);
  const unsubscribe = await waitForLine(subConn, (m) => m.method === 'unsubscribe');
  assert.deepEqual(unsubscribe.params, { subscription: 7 });
  // The subscription had a connection of its own; the client's answers still flow.
  assert.notEqual(subConn, mock.connections[0]);
  assert.equal((await client.hello()).protocol, 1);
});

test('lagged: the events received before it are read, then the iteration throws E_RESOURCE_LAGGED', async (t) => {
  const mock = await mockService(t, (req, conn) => {
    if (req.method === 'subscribe') {
      conn.answer(req.id, { subscription: 3, status: [] });
      conn.send({ jsonrpc: '2.0', method: 'event', params: { event: 'queued', gem: 'notes', resource: 'a' } });
      conn.send({ jsonrpc: '2.0', method: 'event', params: { event: 'queued', gem: 'notes', resource: 'b' } });
      conn.send({ jsonrpc: '2.0', method: 'lagged', params: { subscription: 3, missed: 12 } });
      conn.send({ jsonrpc: '2.0', method: 'event', params: { event: 'queued', gem: 'notes', resource: 'late' } });
      return undefined;
    }
    return {};
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const sub = await client.subscribe();
  const seen = [];
  const error = await (async () => {
    for await (const event of sub) seen.push(event.resource);
  })().then(
    () => assert.fail('the iteration ended without an error'),
    (e) => e,
  );
  assert.deepEqual(seen, ['a', 'b']);
  assert.equal(error.code, E_RESOURCE_LAGGED);
  assert.equal(error.missed, 12);
  assert.equal(error.subscription, 3);
});

test('a subscription whose connection ends throws E_RESOURCE_SERVICE', async (t) => {
  const mock = await mockService(t, (req, conn) => {
    if (req.method === 'subscribe') {
      conn.answer(req.id, { subscription: 1, status: [] });
      setTimeout(() => conn.socket.destroy(), 20);
      return undefined;
    }
    return {};
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const sub = await client.subscribe();
  const error = await sub.next().catch((e) => e);
  assert.equal(error.code, E_RESOURCE_SERVICE);
});

test('a subscription not read stops reading its socket, so the service sees it fall behind', async (t) => {
  let written = 0;
  let stuck;
  const mock = await mockService(t, (req, conn) => {
    if (req.method === 'subscribe') {
      conn.answer(req.id, { subscription: 1, status: [] });
      const event = JSON.stringify({ jsonrpc: '2.0', method: 'event', params: { event: 'progress', pad: 'x'.repeat(1000) } }) + '\n';
      stuck = new Promise((resolve) => {
        const pump = () => {
          while (written < 100_000) {
            written++;
            if (!conn.socket.write(event)) {
              // The kernel's buffers are full: the client stopped reading.
              return resolve(written);
            }
          }
          resolve(null);
        };
        pump();
      });
      return undefined;
    }
    return {};
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  const sub = await client.subscribe();
  const at = await stuck;
  assert.notEqual(at, null, 'the client read 100000 events nobody asked for');
  assert.ok(at < 5000, `the socket filled only after ${at} events`);
  // Reading resumes the socket.
  const first = await sub.next();
  assert.equal(first.value.event, 'progress');
  sub.close();
});

test('findService: null without service.json; connect names the store, and a stale file names the refusal', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gr-js-none-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const store = path.join(dir, 'store');
  assert.equal(storeLayout(store), path.join(store, 'store-v1'));
  assert.equal(await findService(store), null);
  const missing = await connect({ store }).catch((e) => e);
  assert.ok(missing instanceof ResourceError);
  assert.equal(missing.code, E_RESOURCE_SERVICE);
  assert.ok(missing.message.includes(store), missing.message);

  // A service killed with kill -9 leaves its file, naming a socket nobody listens on.
  fs.mkdirSync(path.join(storeLayout(store), 'run'), { recursive: true, mode: 0o700 });
  const socket = path.join(storeLayout(store), 'run', 'api.sock');
  const dead = net.createServer();
  await new Promise((resolve) => dead.listen(socket, resolve));
  await new Promise((resolve) => dead.close(resolve));
  fs.writeFileSync(path.join(storeLayout(store), 'service.json'), JSON.stringify({ protocol: 1, socket, pid: 999999, version: 'x' }));
  assert.equal((await findService(store)).pid, 999999);
  const stale = await connect({ store }).catch((e) => e);
  assert.equal(stale.code, E_RESOURCE_SERVICE);
  assert.ok(stale.message.includes(store) && stale.message.includes(socket), stale.message);
  assert.match(stale.message, /stale/);

  const bySocket = await connect({ socket }).catch((e) => e);
  assert.equal(bySocket.code, E_RESOURCE_SERVICE);
  assert.ok(bySocket.message.includes(socket), bySocket.message);
});

test('connect refuses a service of another protocol, and one that closes without answering', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gr-js-proto-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const socket = path.join(dir, 's.sock');
  let mode = 'v2';
  const server = net.createServer((s) => {
    s.on('error', () => {});
    if (mode === 'close') return s.destroy();
    s.once('data', (d) => {
      const req = JSON.parse(d.toString().split('\n')[0]);
      s.write(JSON.stringify({ jsonrpc: '2.0', id: req.id, result: { protocol: 2 } }) + '\n');
    });
  });
  await new Promise((resolve) => server.listen(socket, resolve));
  t.after(() => new Promise((resolve) => server.close(resolve)));
  const v2 = await connect({ socket }).catch((e) => e);
  assert.equal(v2.code, E_RESOURCE_SERVICE);
  assert.match(v2.message, /protocol 2/);
  mode = 'close';
  const closed = await connect({ socket }).catch((e) => e);
  assert.equal(closed.code, E_RESOURCE_SERVICE);
  assert.match(closed.message, /closed/);
});

function waitForLine(conn, pred, timeout = 2000) {
  const end = Date.now() + timeout;
  return new Promise((resolve, reject) => {
    const look = () => {
      const found = conn.lines.map((l) => JSON.parse(l)).find(pred);
      if (found) return resolve(found);
      if (Date.now() > end) return reject(new Error('no such line'));
      setTimeout(look, 10);
    };
    look();
  });
}

test('forGem(gem).status() resolves to that gem\'s GemStatus, {gem, installed_by, resources}, as PROTOCOL.md says', async (t) => {
  const notes = { gem: 'notes', installed_by: { kind: 'api' }, resources: [] };
  const mock = await mockService(t, (req) => {
    if (req.method === 'status') {
      return { gems: req.params?.gem === 'notes' ? [notes] : [], undeclared_files: 0, undeclared_bytes: 0 };
    }
    return { error: { code: -32601, message: 'unknown method' } };
  });
  const client = await connect({ store: mock.store });
  t.after(() => client.close());
  assert.deepEqual(await client.forGem('notes').status(), notes);
  const missing = await client.forGem('other').status().then(
    () => assert.fail('resolved'),
    (e) => e,
  );
  assert.equal(missing.code, 'E_RESOURCE_NOT_FOUND');
  const protocol = fs.readFileSync(new URL('../../PROTOCOL.md', import.meta.url), 'utf8');
  assert.ok(protocol.includes('`client.forGem(gem).status()`, resolves to that gem\'s `GemStatus` alone,\n`{gem, name?, installed_by, resources}`'), 'PROTOCOL.md does not say it');
});
