// Discovery from the store path alone, and `hello`.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { connect, findService, storeLayout, E_RESOURCE_SERVICE } from '../index.js';
import { Fixture } from './fixture.js';

test('hello answers protocol 1, the store and the pid; service.json is found from the store path alone', { timeout: 30_000 }, async (t) => {
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

  // Once it stops, service.json is gone and connect says no service listens on the store.
  const exit = await ctx.stopService();
  assert.deepEqual(exit, { code: 0, signal: null });
  assert.equal(await findService(ctx.store), null);
  assert.equal(fs.existsSync(path.join(storeLayout(ctx.store), 'service.json')), false);
  const error = await connect({ store: ctx.store }).catch((e) => e);
  assert.equal(error.code, E_RESOURCE_SERVICE);
  assert.ok(error.message.includes(ctx.store), error.message);
});
