// Discovery from the store path alone, and `hello`.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { connect, findService, storeLayout, E_RESOURCE_SERVICE } from '../index.js';
import { FakeService, Fixture, waitFor, within } from './fixture.js';

test('hello answers protocol 1, the store and the pid; service.json is found from the store path alone, and is gone once the service stops', { timeout: 30_000 }, async (t) => {
  const ctx = await Fixture.start(t);
  const info = await findService(ctx.store);
  assert.ok(info, 'no service.json while the service listens');
  assert.equal(info.protocol, 1);
  assert.equal(info.pid, ctx.service.pid);
  assert.equal(info.socket, ctx.service.socket, 'service.json and the listening event name different sockets');
  assert.equal(typeof info.version, 'string');

  const client = await connect({ store: ctx.store });
  t.after(() => client.close());
  const hello = await client.hello();
  assert.equal(hello.protocol, 1);
  assert.equal(hello.pid, ctx.service.pid);
  assert.equal(hello.version, info.version);
  assert.equal(fs.realpathSync(hello.store), fs.realpathSync(ctx.store));
  assert.equal(ctx.service.listeningEvent.pid, ctx.service.pid);

  // The same service by its socket.
  const bySocket = await connect({ socket: info.socket });
  t.after(() => bySocket.close());
  assert.equal((await bySocket.hello()).pid, ctx.service.pid);

  // status names the service too.
  const status = await client.status();
  assert.deepEqual(status.gems, []);
  assert.equal(status.service.pid, ctx.service.pid);
  assert.equal(status.service.socket, info.socket);

  // A request pending when the service stops is answered or rejected, never left hanging.
  const held = ctx.origin.add('held.bin', { size: 64 * 1024 });
  ctx.origin.behave('held.bin', { hold: true });
  await ctx.installGem('notes', [ctx.resource(held, { id: 'held' })], client);
  const pending = client.path('notes', 'held').then(
    () => assert.fail('path answered with a path although its file never came'),
    (e) => e,
  );
  await waitFor('the held download to connect', () => ctx.origin.activeResponses('held.bin') === 1);

  // Once it stops, service.json is gone and connect says no service listens on the store.
  const exit = await ctx.stopService();
  const stopped = await within(5000, pending, 'the pending path');
  t.diagnostic(`a path pending at the stop: ${stopped.code}: ${stopped.message}`);
  assert.ok(['E_RESOURCE_SERVICE', 'E_RESOURCE_SHUTDOWN', 'E_RESOURCE_CANCELLED'].includes(stopped.code), `${stopped.code}: ${stopped.message}`);
  assert.deepEqual(exit, { code: 0, signal: null });
  assert.equal(await findService(ctx.store), null);
  assert.equal(fs.existsSync(path.join(storeLayout(ctx.store), 'service.json')), false);
  const error = await connect({ store: ctx.store }).catch((e) => e);
  assert.equal(error.code, E_RESOURCE_SERVICE);
  assert.ok(error.message.includes(ctx.store), error.message);
});

test('every connection sends hello first, a subscription\'s own too, through a socket as through a store', { timeout: 30_000 }, async (t) => {
  const fake = await FakeService.start(t, (req) => {
    if (req.method === 'hello') return fake.hello(req);
    if (req.method === 'subscribe') return { subscription: 1, status: [] };
    return {};
  });
  fake.writeServiceFile();
  for (const options of [{ socket: fake.socket }, { store: fake.store }]) {
    const from = fake.connections.length;
    const client = await connect(options);
    t.after(() => client.close());
    const sub = await client.subscribe();
    await client.status();
    sub.close();
    const connections = fake.connections.slice(from);
    assert.equal(connections.length, 2, JSON.stringify(options));
    for (const conn of connections) {
      assert.equal(conn.requests[0]?.method, 'hello', `${JSON.stringify(options)}: a connection began with ${conn.lines[0]}`);
    }
    assert.ok(connections.some((conn) => conn.requests[1]?.method === 'subscribe'), JSON.stringify(options));
  }
});
